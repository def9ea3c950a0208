"""The route a model push takes to each host (transfer/routes.py): chosen in one place, for canned conditions, and
the reason that choice carries is what the push prints (`push: direct: HOST (REASON)`) and what each host's
StoreEntry notes; the per-host sequence with the rsync route, including a host that has no rsync."""
import os
import sys
from types import SimpleNamespace

import pytest

import clirun
from clusterctl.errors import RsyncMissing
from clusterctl.transfer import direct
from clusterctl.transfer.localmodel import describe
from clusterctl.transfer.models import push
from clusterctl.transfer.routes import RELAY, ROUTES, RSYNC, SFTP, after, choose
from clusterctl.transfer.storepush import Asked, Job, store
from clusterctl.hosts.connector import Connector
from clusterctl.inventory import load
from test_relay import make_model


def host(name="h4", address=None, local=False):
    return SimpleNamespace(name=name, address=address, local=local)


RSYNC_HERE = "/usr/bin/rsync"


def local_hosts(tmp_path, addresses):
    """Hosts that are all this machine (`local: true`), each with its own store; addresses: name -> its data-plane
    address, or None for none."""
    lines = ["hosts:"]
    for name, address in addresses.items():
        lines += [f"  - name: {name}", "    local: true", f"    model_store: {tmp_path / ('store-' + name)}",
                  f"    python: {sys.executable}"] + ([f"    address: {address}"] if address else [])
    (tmp_path / "inv.yaml").write_text("\n".join(lines) + "\n")
    return Connector(load(str(tmp_path / "inv.yaml")))


@pytest.mark.parametrize("asked, target, route, reason, note", [
    # two or more hosts with a data-plane address, --method auto: relayed
    (Asked(rsync=RSYNC_HERE, addressed=3), host(address="10.0.0.4"), RELAY, "", ""),
    (Asked(rsync=None, addressed=2), host(address="10.0.0.4"), RELAY, "", ""),
    # a host without one beside them: from here, with rsync
    (Asked(rsync=RSYNC_HERE, addressed=3), host(), RSYNC, "no data-plane address", ""),
    # ... and without rsync here: SFTP, its entry saying why
    (Asked(rsync=None, addressed=3), host(), SFTP, "no data-plane address", "no rsync on this machine: sent over SFTP"),
    # the only host with an address has no other to relay to
    (Asked(rsync=RSYNC_HERE, addressed=1), host(address="10.0.0.4"), RSYNC, "the only host with a data-plane address", ""),
    # --direct and --method: from here to every host
    (Asked(direct=True, rsync=RSYNC_HERE, addressed=3), host(address="10.0.0.4"), RSYNC, "--direct", ""),
    (Asked(method="rsync", rsync=RSYNC_HERE, addressed=3), host(address="10.0.0.4"), RSYNC, "--method rsync", ""),
    (Asked(method="sftp", rsync=None, addressed=3), host(address="10.0.0.4"), SFTP, "--method sftp", ""),
    # a host that is this machine: plain copies (the file session), never rsync
    (Asked(rsync=RSYNC_HERE, addressed=1), host(local=True), SFTP, "no data-plane address",
     "no rsync on this machine: sent over SFTP"),
    (Asked(method="rsync", rsync=RSYNC_HERE), host(local=True), SFTP, "--method rsync", ""),
])
def test_the_route_and_its_reason_for_canned_conditions(asked, target, route, reason, note):
    choice = choose(asked, target)
    assert (choice.route, choice.reason, choice.note) == (route, reason, note)


def test_a_host_the_relay_hands_back_goes_to_the_next_route_that_takes_it():
    assert after(RELAY) == (RSYNC, SFTP) and after(SFTP) == ()
    asked = Asked(rsync=RSYNC_HERE, addressed=3)
    assert choose(asked, host(address="10.0.0.4"), after(RELAY)).route is RSYNC
    assert choose(Asked(rsync=None, addressed=3), host(address="10.0.0.4"), after(RELAY)).route is SFTP
    assert ROUTES[-1].refusal(Asked(), host()) is None          # the last route takes every host


def test_what_the_push_prints_and_notes_is_the_choice(tmp_path, monkeypatch):
    """The reason printed for a host pushed from here, and its entry's note, are the Choice's, whatever its words:
    the relay's refusal replaced by a canned one reaches the route's lines unchanged."""
    model = describe(str(make_model(tmp_path, size=1 << 16)))
    connector = local_hosts(tmp_path, {"a": "127.0.0.1", "b": "127.0.0.2", "c": None})   # c not on the data plane
    asked = Asked(rsync=RSYNC_HERE, addressed=2)
    choices = {h.name: choose(asked, h) for h in connector.cluster.hosts}
    assert [choices[n].route for n in "abc"] == [RELAY, RELAY, SFTP]
    told = []
    group = push(connector, None, model, on_route=told.append)
    assert group.all_ok, {n: o.error for n, o in group.items()}
    assert told[0].chains == [["a", "b"]] and told[0].direct == {"c": choices["c"].reason}
    assert f"direct: c ({choices['c'].reason})" in told[0].lines()
    assert group["c"].value.method == "sftp" and group["c"].value.note == choices["c"].note

    monkeypatch.setattr(type(RELAY), "refusal", lambda self, asked, host: "a canned reason")
    (tmp_path / "second").mkdir()
    fresh = describe(str(make_model(tmp_path / "second", size=1 << 16)))
    told = []
    group = push(connector, None, fresh, on_route=told.append)
    assert group.all_ok and [r.lines() for r in told] == [["direct: a, b, c (a canned reason)"]]


def test_the_cli_prints_the_reason_the_choice_carries(tmp_path):
    model = make_model(tmp_path, size=1 << 16)
    local_hosts(tmp_path, {"a": None, "b": None})
    done = clirun.clusterctl("models", "push", str(model), "--hosts", str(tmp_path / "inv.yaml"), "--direct",
                             cwd=tmp_path, own_cache=True)
    assert done.returncode == 0, done.stderr
    reason = choose(Asked(direct=True, rsync=RSYNC_HERE, addressed=2), host(local=True)).reason
    assert f"push: direct: a, b ({reason})" in done.stderr.splitlines()


@pytest.mark.parametrize("missing", [False, True])
def test_the_rsync_route_through_the_per_host_sequence_and_sftp_for_a_host_without_rsync(tmp_path, monkeypatch,
                                                                                          missing):
    model = describe(str(make_model(tmp_path)))
    connector = local_hosts(tmp_path, {"a": None})
    target = connector.cluster.hosts[0]
    if missing:
        def no_rsync(*args, **kwargs):
            raise RsyncMissing("a: rsync: command not found")
        monkeypatch.setattr(direct, "rsync_push", no_rsync)
    seen = {}
    job = Job(connector, model, {"a": [f.path for f in model.files]}, Asked(rsync=RSYNC_HERE), deadline=60,
              progress=lambda name, done, total: seen.__setitem__(name, (done, total)))
    entry = store(job, target, RSYNC.send)
    assert (entry.method, entry.note) == (("sftp", "no rsync on the host: sent over SFTP") if missing else ("rsync", ""))
    assert sorted(entry.sent_files) == sorted(f.path for f in model.files) and seen["a"] == (model.size, model.size)
    assert os.path.isfile(os.path.join(entry.path, "model.safetensors"))
    assert store(job, target, RSYNC.send).reused                       # the second push moves nothing

