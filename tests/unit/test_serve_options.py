"""What `serve` decides on this machine before anything starts (serve/service.py, serve/check.py): the options of
mlx-lm's server it owns, refused after `--` however abbreviated; a --listen address the URL could not reach; and the
id a model directory is served under (a run's result by its marker, any other directory by its name)."""
import argparse
import json
import socket

import pytest

from clusterctl.errors import PortTaken, UsageError
from clusterctl.hosts.connector import Connector
from clusterctl.inventory import Cluster, Host
from clusterctl.serve import service
from clusterctl.serve.check import served_name
from clusterctl.serve.service import OWNED, ServeOptions, owned_option
from clusterctl.trainer_contract import EXPORT_MARKER


def refusal(*server_args) -> str:
    with pytest.raises(UsageError) as e:
        service._check_args(ServeOptions(model="m", server_args=server_args))
    text = str(e.value)
    assert "\n" not in text and e.value.exit_code == 2
    return text


# ---- serve's own options after `--` ------------------------------------------------------------------------------
def test_every_abbreviation_of_an_option_serve_owns_is_refused_with_the_option_it_means():
    assert refusal("--hos", "0.0.0.0").startswith("--hos after `--`: mlx-lm's server may take it for --host, which "
                                                   "serve sets (use serve's own MODEL, --listen, --port, --pipeline)")
    assert refusal("--max-tokens", "8", "--po=9").startswith("--po after `--`: mlx-lm's server may take it for --port")
    assert "may take it for --model" in refusal("--mod", "/elsewhere")
    assert "may take it for --pipeline" in refusal("--pip")
    assert "may take it for --port or --pipeline, which serve sets" in refusal("--p", "1")    # argparse: ambiguous
    assert refusal("--port", "9").startswith("--port after `--`: serve sets it")
    assert refusal("--host=0.0.0.0").startswith("--host after `--`: serve sets it")


def test_the_servers_other_options_and_values_pass():
    service._check_args(ServeOptions(model="m", server_args=("--max-tokens", "8", "--temp=0.7", "--prompt-cache-size",
                                                             "4", "--chat-template", "host port", "-h")))
    assert [owned_option(w) for w in ("--", "--max-tokens", "--pr", "0.0.0.0", "-p", "--top-k=3")] == [None] * 6
    assert [owned_option(w) for w in ("--h", "--p", "--m", "--pipeline=1")] == ["--host", "--port", "--model",
                                                                               "--pipeline"]


def mlx_lm_server_parser() -> argparse.ArgumentParser:
    """mlx-lm's own server parser, as its main() builds it (stopped at parse_args, before anything starts)."""
    server = pytest.importorskip("mlx_lm.server")

    class Built(Exception):
        pass

    def caught(self, *args, **kwargs):
        raise Built(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", caught)
        with pytest.raises(Built) as built:
            server.main()
    return built.value.args[0]


def test_no_option_of_mlx_lms_server_but_serves_own_is_refused_and_each_of_serves_own_is_one_of_its():
    parser = mlx_lm_server_parser()
    options = {s for action in parser._actions for s in action.option_strings if s.startswith("--")}
    assert set(OWNED) <= options
    # a word refused that mlx-lm took as another option would be an option it has that is a prefix of serve's own
    assert {o for o in options - set(OWNED) if owned_option(o)} == set()
    # what argparse resolves an abbreviation of an owned option to is that option: refused
    for option in OWNED:
        word = option[:5]
        namespace, rest = parser.parse_known_args([word] + ([] if option == "--pipeline" else ["1"]))
        assert rest == [] and getattr(namespace, option[2:]) in ("1", 1, True) and owned_option(word) == option


# ---- --listen ------------------------------------------------------------------------------------------------------
def host(**kwargs) -> Host:
    return Host(**{"name": "mini1", "rank": 0, "line": 1, **kwargs})


def test_a_loopback_listen_on_another_host_is_refused_naming_the_fix():
    for listen in ("127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost"):
        with pytest.raises(UsageError) as e:
            service._check_listen(host(hostname="10.0.0.2"), listen, 8080)
        assert str(e.value) == (f"--listen {listen} is mini1's own loopback, which this machine cannot reach: leave out "
                                "--listen (serve then carries http://127.0.0.1:8080 here to it over SSH), or give an "
                                "address of the host's network")


def test_a_listen_the_url_reaches_passes():
    service._check_listen(host(local=True), "127.0.0.1", 8080)               # this machine's own loopback
    service._check_listen(host(name="127.0.5.11"), "127.0.5.11", 8080)       # the address the host is reached at
    service._check_listen(host(hostname="127.0.5.12"), "127.0.5.12", 8080)
    for listen in (None, "0.0.0.0", "::", "192.168.1.20", "mini1.local"):
        service._check_listen(host(), listen, 8080)


def test_a_listen_address_the_host_cannot_bind_is_named_for_what_it_is(tmp_path):
    cluster = Cluster.this_machine(str(tmp_path), slots=1, backend="ring")
    connector, here = Connector(cluster), cluster.hosts[0]
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(PortTaken, match=f"^port {port} on 127.0.0.1 is in use on this machine [(]"):
            service._check_port_free(connector, here, "127.0.0.1", port)
    finally:
        taken.close()
    with pytest.raises(UsageError, match=r"^--listen 10[.]9[.]9[.]9 is not an address of this machine [(]it has "
                                         r"127[.]0[.]0[.]1(, [0-9.]+)*[)]: give one of its own, or 0.0.0.0 for all"):
        service._check_port_free(connector, here, "10.9.9.9", port)
    with pytest.raises(UsageError, match=r"^--listen nosuch[.]invalid: this machine cannot resolve it [(].+[)]: give "
                                         "one of its IP addresses$"):
        service._check_port_free(connector, here, "nosuch.invalid", port)
    service._check_port_free(connector, here, "127.0.0.1", port)                # free again


# ---- the served name -----------------------------------------------------------------------------------------------
def marked(tmp_path, name, marker) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / EXPORT_MARKER).write_text(marker if isinstance(marker, str) else json.dumps(marker))
    return str(d)


def test_a_runs_result_is_served_under_its_source_model_and_run(tmp_path):
    run = "20261126-101500-ab12cd"
    assert served_name(marked(tmp_path, "model", {"run": run, "model": "models/Qwen3-8B/", "step": 120})) \
        == f"Qwen3-8B-ft-{run}"
    assert served_name(marked(tmp_path, "out", {"run": run, "model": "/Users/me/mymodel", "step": 3}) + "/") \
        == f"mymodel-ft-{run}"
    assert served_name(marked(tmp_path, "scratch", {"run": run, "model": None, "step": 400})) == f"clusterctl-{run}"


def test_any_other_directory_and_any_marker_that_does_not_hold_is_served_under_its_own_name(tmp_path):
    (tmp_path / "plain").mkdir()
    assert served_name(str(tmp_path / "plain")) == "plain"
    for i, marker in enumerate(["{not json", "[1]", {"model": "m"}, {"run": "", "model": "m"}, {"run": 7, "model": "m"},
                                {"run": "a b/../c", "model": "m"}, {"run": "r1", "model": 5}, {"run": "r1", "model": ""},
                                {"run": "r1", "model": "/"}]):
        assert served_name(marked(tmp_path, f"d{i}", marker)) == f"d{i}", marker
