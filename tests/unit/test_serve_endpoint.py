"""serve's pieces on this machine: the port carried to a host (hosts/forward.py, through the local transport, the
same code an SSH channel goes through), the endpoint's readiness and health (serve/endpoint.py) against a small
HTTP server that answers as mlx-lm's does, and what every serving rank does before mlx-lm's main (serve/rank.py)."""
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clusterctl.errors import PortTaken
from clusterctl.hosts.forward import Forward
from clusterctl.hosts.local import LocalTransport
from clusterctl.serve import endpoint, rank
from clusterctl.serve.endpoint import Endpoint

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FakeServer:
    """Answers like mlx-lm's server: /health at once, completions only once `loaded`, /v1/models."""

    def __init__(self):
        self.loaded = threading.Event()
        self.seen: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                outer.seen.append((self.path, self.headers.get("User-Agent", "")))
                if self.path == "/health":
                    self._send(200, {"status": "ok"})
                else:
                    self._send(200, {"object": "list", "data": [{"id": "/store/tiny", "object": "model"}]})

            def do_POST(self):
                outer.seen.append((self.path, self.headers.get("User-Agent", "")))
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.loaded.wait(10)
                self._send(200, {"choices": [{"text": "a"}]})

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, json.loads(r.read())


# ---- the forward ---------------------------------------------------------------------------------------------
def test_a_forwarded_port_answers_from_the_target_and_is_free_again_once_closed(server):
    server.loaded.set()
    forward = Forward.bind(0)
    forward.point(LocalTransport(), "127.0.0.1", server.port)
    forward.start()
    assert get(forward.url + "/health") == (200, {"status": "ok"})
    assert endpoint.model_ids(forward.url) == ["/store/tiny"]
    port = forward.port
    forward.close()
    with pytest.raises(OSError):
        get(f"http://127.0.0.1:{port}/health", timeout=2)
    Forward.bind(port).close()               # nothing holds the port any more


def test_a_port_in_use_is_refused_in_one_line_before_anything_starts():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(PortTaken) as e:
            Forward.bind(port)
        assert str(e.value).startswith(f"port {port} on 127.0.0.1 is in use on this machine")
        assert "\n" not in str(e.value) and "--port" in str(e.value)
    finally:
        taken.close()


def test_a_connection_while_nothing_listens_there_is_closed_and_the_next_one_is_carried(server):
    server.loaded.set()
    idle = socket.socket()
    idle.bind(("127.0.0.1", 0))
    nothing = idle.getsockname()[1]
    idle.close()
    with Forward.bind(0) as forward:
        forward.start()
        forward.point(LocalTransport(), "127.0.0.1", nothing)
        with pytest.raises(OSError):
            get(forward.url + "/health", timeout=2)
        forward.point(LocalTransport(), "127.0.0.1", server.port)        # the server (re)started elsewhere
        assert get(forward.url + "/health")[0] == 200


def test_a_large_body_crosses_the_forward_whole_in_both_directions():
    received = []

    def echo(listener):
        conn, _ = listener.accept()
        data = b""
        while len(data) < 3_000_000:
            data += conn.recv(65536)
        received.append(len(data))
        conn.sendall(data[::-1])
        conn.close()

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    threading.Thread(target=echo, args=(listener,), daemon=True).start()
    payload = bytes(range(256)) * (3_000_000 // 256 + 1)
    payload = payload[:3_000_000]
    with Forward.bind(0) as forward:
        forward.point(LocalTransport(), "127.0.0.1", listener.getsockname()[1])
        forward.start()
        client = socket.create_connection(("127.0.0.1", forward.port), timeout=10)
        client.sendall(payload)
        back = b""
        while len(back) < len(payload):
            chunk = client.recv(65536)
            if not chunk:
                break
            back += chunk
        client.close()
    listener.close()
    assert received == [3_000_000] and back == payload[::-1]


# ---- the endpoint ----------------------------------------------------------------------------------------------
def test_ready_means_a_completion_was_answered_not_that_health_answers(server):
    url = f"http://127.0.0.1:{server.port}"
    readies = []
    watched = Endpoint(url, readies.append, health_s=0.2)
    watched.attempt_started()
    time.sleep(1.0)
    assert endpoint.healthy(url) and readies == [] and watched.answered is None     # /health, no model yet
    server.loaded.set()
    deadline = time.monotonic() + 10
    while not readies and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(readies) == 1 and 0.9 < readies[0] < 10
    first = watched.answered
    time.sleep(0.7)
    assert watched.answered > first                       # health answers keep coming: the stall watch's progress
    assert {agent for _, agent in server.seen} == {endpoint.PROBE_AGENT}
    server.loaded.clear()                                 # a restart: the new ranks load the model again
    watched.attempt_started()                             # ... and the last attempt's answers are forgotten
    assert watched.answered is None
    time.sleep(0.7)
    assert watched.answered is None and len(readies) == 1   # health answers alone do not make the new attempt ready
    server.loaded.set()
    deadline = time.monotonic() + 10
    while len(readies) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(readies) == 2 and watched.answered is not None
    watched.stop()


def test_an_endpoint_that_stops_answering_is_not_healthy(server):
    url = f"http://127.0.0.1:{server.port}"
    assert endpoint.healthy(url)
    server.close()
    assert not endpoint.healthy(url, timeout=2) and not endpoint.one_token(url, timeout=2)


# ---- what every serving rank does first ------------------------------------------------------------------------
def test_each_rank_takes_its_own_hosts_copy_of_the_model(tmp_path, monkeypatch):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    name, models = rank.read_spec(json.dumps({"name": "tiny", "models": [str(tmp_path / "a"), str(tmp_path / "b")]}))
    assert name == "tiny"
    assert rank.model_for(models, 0) == str((tmp_path / "a").resolve())
    assert rank.model_for(models, 1) == str((tmp_path / "b").resolve())
    monkeypatch.setenv("HOME", str(tmp_path))
    assert rank.model_for(["~/a"], 3) == str((tmp_path / "a").resolve())
    for bad in ('"a"', "[]", '{"name": "x", "models": []}', '{"models": ["/m"]}', '{"name": "x", "models": [1]}'):
        with pytest.raises(SystemExit, match="SPEC_JSON must be"):
            rank.read_spec(bad)
    with pytest.raises(SystemExit, match="no model there"):
        rank.model_for([str(tmp_path)], 0)


def test_the_rank_number_comes_from_whichever_launcher_started_it(monkeypatch):
    for name in ("OMPI_COMM_WORLD_RANK", "MLX_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert rank.rank() == 0
    monkeypatch.setenv("MLX_RANK", "3")
    assert rank.rank() == 3
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    assert rank.rank() == 1


KNOWN_AS = """
import argparse, json
from mlx_lm import server
from clusterctl.serve import rank
rank.known_as(server, ["tiny", "/h0/store/tiny-ab", "/h1/store/tiny-ab"])
args = argparse.Namespace(model="/h1/store/tiny-ab", adapter_path=None, draft_model=None, pipeline=False,
                          trust_remote_code=False, chat_template="")
provider = server.ModelProvider(args)
loads = []
provider._load = lambda *key: loads.append(key) or setattr(provider, "model_key", key)
for asked in ("default_model", "tiny", "/h0/store/tiny-ab", "/h1/store/tiny-ab", "default_model", "some/other"):
    provider.load(asked, None, None)
print(json.dumps(loads))
"""


def test_every_rank_serves_the_model_by_any_of_its_names_without_loading_another():
    # in a child process: mlx-lm's ModelProvider initialises MLX's distributed group, which must never happen in
    # the test process (an MPI world of one left there breaks later mpirun tests)
    pytest.importorskip("mlx_lm")
    done = subprocess.run([sys.executable, "-c", KNOWN_AS], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr[-2000:]
    loads = json.loads(done.stdout.strip().splitlines()[-1])
    # one load for every name of the loaded model; a name it does not hold is still another model
    assert loads == [["/h1/store/tiny-ab", None, None], ["some/other", None, None]]


ADMIT = """
import argparse, functools, json, sys, threading, urllib.error, urllib.request
from clusterctl.serve import rank
store, requests = sys.argv[1], json.loads(sys.argv[2])      # rank.main gives mlx-lm's main an argv of its own
try:
    rank.main(["rank", json.dumps({"name": "tiny", "models": [store]}), "--help"])    # mlx-lm's main stops there
except SystemExit:
    pass
import huggingface_hub.constants
from mlx_lm import server
reached = []

class Generator:            # what a request that passed the handler hands on (the model, its draft, its adapter)
    cli_args = argparse.Namespace(num_draft_tokens=3, max_tokens=8, temp=0.0, top_p=1.0, top_k=0, min_p=0.0,
                                  allowed_origins=["*"])

    def generate(self, request, args, progress_callback=None):
        reached.append([args.model.model, args.model.draft, args.model.adapter])
        raise RuntimeError("reached the generator")

httpd = server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(server.APIHandler, Generator()))
threading.Thread(target=httpd.serve_forever, daemon=True).start()
answers = []
for path, body in requests:
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{httpd.server_address[1]}{path}", data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            answers.append([r.status, r.read().decode()])
    except urllib.error.HTTPError as e:
        answers.append([e.code, e.read().decode()])
print(json.dumps({"offline": huggingface_hub.constants.HF_HUB_OFFLINE, "reached": reached, "answers": answers}))
"""


def test_a_request_for_another_model_adapter_or_draft_model_is_a_404_naming_the_served_model_and_loads_nothing(
        tmp_path):
    # mlx-lm's own request handler, after what every rank does before mlx-lm's main; in a child process (mlx-lm's
    # server module reads the hub's offline switch once, at import)
    pytest.importorskip("mlx_lm")
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text("{}")
    store = str(tmp_path / "tiny")
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    refused = [("/v1/chat/completions", {**chat, "model": "other"}),
               ("/v1/completions", {"prompt": "hi", "model": "mlx-community/Qwen3-0.6B-4bit"}),
               ("/chat/completions", {**chat, "model": "/etc"}),
               ("/v1/completions", {"prompt": "hi", "model": 5}),
               ("/v1/completions", {"prompt": "hi", "adapters": "/tmp/adapters"}),
               ("/v1/chat/completions", {**chat, "model": "tiny", "draft_model": "mlx-community/small"})]
    fetch = ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/never-fetched.png"}}]}]})
    served = [("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {**chat, "model": "tiny"}),
              ("/v1/completions", {"prompt": "hi", "model": store}), ("/v1/completions", {"prompt": "hi", "model": None})]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    done = subprocess.run([sys.executable, "-c", ADMIT, store, json.dumps(refused + served + [fetch, ("/v1/completions", "{x")])],
                          capture_output=True, text=True, timeout=120, env={**env, "PYTHONPATH": REPO,
                                                                            "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["offline"] is True                    # nothing a rank loads is looked up on the hub
    answers = out["answers"]
    for (status, body), (path, request) in zip(answers, refused):
        error = json.loads(body)["error"]
        assert status == 404 and error["code"] == "model_not_found" and '"tiny"' in error["message"], (request, body)
    assert [json.loads(b)["error"]["message"] for _, b in answers[:2]] == [
        'model "other" is not served here: this endpoint serves only "tiny" (name it, or leave out model)',
        'model "mlx-community/Qwen3-0.6B-4bit" is not served here: this endpoint serves only "tiny" (name it, or '
        'leave out model)']
    assert json.loads(answers[4][1])["error"] == {
        "message": 'this endpoint loads no adapters: it serves only "tiny" as it is (leave out adapters)',
        "type": "invalid_request_error", "param": "adapters", "code": "model_not_found"}
    # the others reach mlx-lm naming the served model, which its reply then echoes; no draft, no adapter
    assert out["reached"] == [["tiny", "default_model", None]] * len(served)
    status, body = answers[-2]                       # an image by URL: refused before mlx-lm would fetch it
    assert status == 400 and json.loads(body)["error"]["code"] == "url_not_fetched", body
    assert answers[-1][0] == 400                     # not JSON: mlx-lm's own answer
    assert not (tmp_path / ".cache").exists()


def test_what_a_request_may_name_is_the_served_model_and_nothing_else():
    names = {"tiny", "/s/tiny-ab", "default_model"}
    for body in ({}, {"model": "tiny"}, {"model": "/s/tiny-ab"}, {"model": None}, {"model": "default_model"},
                 {"adapters": None, "draft_model": None}):
        admitted, error = rank.admit({"prompt": "p", **body}, "tiny", names)
        assert error is None and admitted == {"prompt": "p", **body, "model": "tiny"}
    for body, field in (({"model": "Tiny"}, "model"), ({"model": ["tiny"]}, "model"), ({"model": {}}, "model"),
                        ({"adapters": "a"}, "adapters"), ({"draft_model": "tiny"}, "draft_model"),
                        ({"model": "tiny", "adapters": ""}, "adapters")):
        admitted, error = rank.admit(body, "tiny", names)
        assert admitted is None and '"tiny"' in error["message"] and "\n" not in error["message"]
        assert (error["param"], error["code"], error["type"]) == (field, "model_not_found", "invalid_request_error")
    assert rank.admit([1], "tiny", names) == ([1], None) and rank.admit(None, "tiny", names) == (None, None)


def test_an_image_by_url_is_refused_and_an_inline_one_passes():
    """mlx-lm's server downloads an http(s) image URL on rank 0's host: a request may not make the host fetch."""
    names = {"tiny"}
    inline = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    for part in ({"type": "image_url", "image_url": {"url": "http://10.0.0.1/secret"}},
                 {"type": "input_image", "image_url": "HTTPS://example.com/x.png"},
                 {"type": "image", "image": "https://example.com/y.png"}):
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, inline, part]}]}
        admitted, error = rank.admit(body, "tiny", names)
        assert admitted is None and (error["param"], error["code"]) == ("messages", "url_not_fetched"), part
        assert "data: URL" in error["message"] and "\n" not in error["message"]
    body = {"messages": [{"role": "user", "content": [inline]}, {"role": "user", "content": "http://plain.text"}]}
    assert rank.admit(body, "tiny", names) == ({**body, "model": "tiny"}, None)


def test_v1_models_lists_the_served_model_whatever_the_hosts_cache_holds():
    class Handler:
        created = 1

        def __init__(self, path):
            self.path, self.sent, self.wfile = path, [], io.BytesIO()

        def _set_completion_headers(self, code):
            self.sent.append(code)

        def end_headers(self):
            self.sent.append("end")

    fake = types.SimpleNamespace(APIHandler=Handler)
    rank.list_served(fake, "tiny")
    for path, ids in (("/v1/models", ["tiny"]), ("/v1/models/tiny", ["tiny"]), ("/v1/models/other", [])):
        h = Handler(path)
        h.handle_models_request()
        body = json.loads(h.wfile.getvalue())
        assert h.sent == [200, "end"] and [m["id"] for m in body["data"]] == ids and body["object"] == "list"


def test_clusterctls_own_requests_stay_out_of_the_request_log():
    logged = []

    class APIHandler:
        def log_message(self, fmt, *args):
            logged.append(fmt % args)

    rank.quiet_probes(types.SimpleNamespace(APIHandler=APIHandler))
    probe, user = APIHandler(), APIHandler()
    probe.headers = {"User-Agent": endpoint.PROBE_AGENT}
    user.headers = {"User-Agent": "curl/8.0"}
    probe.log_message('"%s" %s', "GET /health", 200)
    user.log_message('"%s" %s', "GET /health", 200)
    assert logged == ['"GET /health" 200'] and rank.PROBE_AGENT == endpoint.PROBE_AGENT


def test_http_errors_are_answers_not_failures(server):
    url = f"http://127.0.0.1:{server.port}"
    assert endpoint.request(url, "/nothing")[0] == 200     # the fake lists models for any other GET
    with pytest.raises(urllib.error.URLError):
        endpoint.request("http://127.0.0.1:1", "/health", timeout=1)
