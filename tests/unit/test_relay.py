"""Relayed model pushes (transfer/relay.py, hosts/scripts/relay.py): the offsets and the chain's order (pure), and
whole pushes among hosts that are this machine (`local: true`, each with its own loopback address and store), so
the relay's hops run as they do on hosts, without sshd; the real-sshd tests are in tests/ssh/test_model_store_ssh.py."""
import hashlib
import json
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from clusterctl.hosts.connector import Connector
from clusterctl.hosts.scripts import program
from clusterctl.inventory import load
from clusterctl.transfer.models import Route, describe, push
from clusterctl.transfer.relay import HopFile, offsets, rotate


def hop(name, files):
    """A stand-in for relay.RemoteHop: files {rel: HopFile(size, have, want, mode)}."""
    return SimpleNamespace(name=name, files=files, held=sum(f.have for f in files.values()))


@pytest.mark.parametrize("hops, expected", [
    ([(0, True), (0, True), (0, True)], [0, 0, 0]),                 # nobody holds anything: all from 0
    ([(60, True), (40, True), (10, True)], [60, 40, 10]),           # a cut-off chain: each from what it holds
    ([(100, False), (0, True), (0, True)], [100, 0, 0]),            # the first holds it all: nothing from here
    ([(0, False), (0, True), (30, True)], [0, 0, 30]),              # a host not wanting it passes it on
    ([(0, False), (50, True), (20, True)], [50, 50, 20]),           # ... only what the next lacks beyond its own
    ([(100, False), (100, False)], [100, 100]),                     # nothing to send
])
def test_each_hop_receives_only_what_it_and_the_hops_after_it_lack(hops, expected):
    chain = [hop(f"h{i}", {"w": HopFile(100, have, want, 0o644)}) for i, (have, want) in enumerate(hops)]
    assert offsets(chain, "w") == expected


def test_the_chain_keeps_inventory_order_from_the_host_holding_most():
    def files(have):
        return {"w": HopFile(100, have, have < 100, 0o644)}
    a, b, c = hop("a", files(0)), hop("b", files(70)), hop("c", files(70))
    assert [h.name for h in rotate([a, b, c])] == ["b", "c", "a"]          # most held; a tie: inventory order
    assert [h.name for h in rotate([a, hop("b", files(0)), hop("c", files(0))])] == ["a", "b", "c"]
    assert rotate([]) == []


def test_the_route_in_words():
    route = Route(chains=[["h1", "h2"], ["h3"]], direct={"h4": "no data-plane address", "h5": "no data-plane address"},
                  via={"h1": "ssh", "h3": "ssh"}, notes=["h2 cannot reach h3 on the data plane (refused): h3 begins "
                                                        "another chain"])
    assert route.lines() == ["relay: this machine -(ssh)-> h1 -> h2", "relay: this machine -(ssh)-> h3",
                             "direct: h4, h5 (no data-plane address)",
                             "h2 cannot reach h3 on the data plane (refused): h3 begins another chain"]


def make_model(root, size=3 << 20):
    d = root / "model"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama"}')
    (d / "model.safetensors").write_bytes(os.urandom(size))
    (d / "empty.txt").write_bytes(b"")
    return d


def local_cluster(tmp_path, names=("a", "b", "c"), addresses=None):
    """Hosts that are all this machine, each listening on its own loopback address, each with its own store."""
    lines = ["hosts:"]
    for i, name in enumerate(names):
        lines += [f"  - name: {name}", "    local: true", f"    address: {(addresses or {}).get(name, f'127.0.0.{i + 1}')}",
                  f"    model_store: {tmp_path / ('store-' + name)}", f"    python: {sys.executable}"]
    (tmp_path / "inv.yaml").write_text("\n".join(lines) + "\n")
    return Connector(load(str(tmp_path / "inv.yaml")))


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_relayed_push_reaches_every_host_verified_each_byte_once(tmp_path):
    model = describe(str(make_model(tmp_path)))
    connector = local_cluster(tmp_path)
    routes, seen = [], {}
    group = push(connector, None, model, on_route=routes.append,
                 progress=lambda host, done, total: seen.__setitem__(host, (done, total)))
    assert group.all_ok, {n: o.error for n, o in group.items()}
    assert [r.chains for r in routes] == [[["a", "b", "c"]]] and routes[0].via == {"a": "data plane"}
    assert routes[0].sent_here == model.size                   # the bytes left this machine once
    for name, upstream in (("a", "this machine"), ("b", "a"), ("c", "b")):
        entry = group[name].value
        assert entry.method == "relay" and entry.note == f"relayed from {upstream}" and entry.sent_bytes == model.size
        assert sorted(entry.sent_files) == ["config.json", "empty.txt", "model.safetensors"]
        for f in model.files:
            assert sha(tmp_path / f"store-{name}" / model.key / f.path) == f.sha256
        assert seen[name] == (model.size, model.size)
    again = push(connector, None, model, on_route=routes.append)
    assert all(o.value.reused and o.value.sent_bytes == 0 for o in again.values())


def test_a_host_that_holds_the_model_feeds_the_others_and_a_cut_off_copy_continues(tmp_path):
    model = describe(str(make_model(tmp_path)))
    connector = local_cluster(tmp_path)
    hosts = connector.cluster.hosts
    assert push(connector, [hosts[1]], model, direct=True).all_ok           # b holds the model
    # c holds the first MiB of the weights, as a push cut off there leaves it
    part = tmp_path / "store-c" / ".partial" / f"{model.key}@c" / ".clusterctl-partial"
    part.mkdir(parents=True)
    weights = (tmp_path / "model" / "model.safetensors").read_bytes()
    (part / "model.safetensors").write_bytes(weights[:1 << 20])
    routes = []
    group = push(connector, None, model, on_route=routes.append)
    assert group.all_ok, {n: o.error for n, o in group.items()}
    assert routes[0].chains == [["b", "c", "a"]] and routes[0].sent_here == 0      # nothing from this machine
    assert group["b"].value.reused
    c, a = group["c"].value, group["a"].value
    assert c.note == "relayed from b" and c.resumed_bytes == 1 << 20 and c.sent_bytes == model.size - (1 << 20)
    assert a.note == "relayed from c" and a.sent_bytes == model.size
    for name in "abc":
        assert sha(tmp_path / f"store-{name}" / model.key / "model.safetensors") == model.file("model.safetensors").sha256


def test_direct_and_an_address_a_host_cannot_listen_on_push_directly_and_say_why(tmp_path):
    model = describe(str(make_model(tmp_path, size=1 << 16)))
    connector = local_cluster(tmp_path, addresses={"c": "192.0.2.1"})      # TEST-NET: no address of this machine
    routes = []
    group = push(connector, None, model, on_route=routes.append)
    assert group.all_ok, {n: o.error for n, o in group.items()}
    assert routes[0].chains == [["a", "b"]]
    assert routes[0].direct["c"].startswith("its relay could not start: cannot listen on 192.0.2.1: ")
    assert group["c"].value.method in ("rsync", "sftp") and group["b"].value.method == "relay"
    routes = []
    (tmp_path / "second").mkdir()
    fresh = describe(str(make_model(tmp_path / "second", size=1 << 16)))
    group = push(connector, None, fresh, on_route=routes.append, direct=True)
    assert group.all_ok and {o.value.method for o in group.values()} <= {"rsync", "sftp"}
    assert routes[0].lines() == ["direct: a, b, c (--direct)"]


def one_hop(target):
    """hosts/scripts/relay.py run here, to write one file of 5 bytes into `target`: (its process, its token)."""
    request = {"listen": "127.0.0.1", "dir": str(target), "source": str(target), "parts": ".parts", "wait": 20,
               "files": {"f.bin": [5, 0, True, 0o640]}}
    token = "t" * 32
    return subprocess.Popen([sys.executable, "-c", program("relay.py"), json.dumps(request)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "CLUSTERCTL_RELAY_TOKEN": token}), token


def test_a_hop_takes_only_the_connection_with_its_token(tmp_path):
    """hosts/scripts/relay.py alone: a stray connection (wrong token) is closed unread; the right one is served."""
    target = tmp_path / "dir"
    target.mkdir()
    proc, token = one_hop(target)
    try:
        port = json.loads(proc.stdout.readline())["port"]
        stray = socket.create_connection(("127.0.0.1", port))
        stray.sendall(b"wrong-token\n")
        assert stray.recv(10) == b""                               # closed by the hop
        good = socket.create_connection(("127.0.0.1", port))
        good.sendall((token + "\n" + json.dumps({"route": []}) + "\n" +
                      json.dumps({"files": [["f.bin", [0]]]}) + "\n").encode() + b"hello")
        good.close()
        answer = json.loads(proc.stdout.read().strip().splitlines()[-1])
        assert answer == {"done": True, "got": 5, "sent": 0}
        assert (target / "f.bin").read_bytes() == b"hello" and oct((target / "f.bin").stat().st_mode & 0o777) == "0o640"
    finally:
        proc.kill()
        proc.wait()


def test_a_hop_refuses_a_file_it_was_not_given(tmp_path):
    proc, token = one_hop(tmp_path)
    try:
        port = json.loads(proc.stdout.readline())["port"]
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall((token + "\n" + json.dumps({"route": []}) + "\n" +
                      json.dumps({"files": [["../../etc/passwd", [0]]]}) + "\n").encode())
        answer = json.loads(proc.stdout.read().strip().splitlines()[-1])
        assert not answer["done"] and "not a file of this push" in answer["error"]
        assert sorted(os.listdir(tmp_path)) == []
    finally:
        proc.kill()
        proc.wait()


class FakeHop:
    """What relay._chains reads of a RemoteHop: its name, address, port and token, and its word on reaching the next."""

    def __init__(self, name, reach=None):
        self.name, self.reach, self.port, self.token = name, reach, 9000, f"token-{name}"
        self.hp = SimpleNamespace(host=SimpleNamespace(address=f"10.0.0.{ord(name[-1])}", local=False))
        self.upstream = "this machine"
        self.sent = b""

    def wait_for(self, what, timeout):
        return bool(what())

    def failure(self):
        return "its relay ended"


def test_a_hop_that_cannot_reach_the_next_ends_its_chain_and_the_next_begins_one_fed_from_here(monkeypatch):
    from clusterctl.transfer import relay

    opened = []

    def connect(head, from_plane):
        opened.append(head.name)
        return SimpleNamespace(sendall=lambda data: setattr(head, "sent", head.sent + data))

    monkeypatch.setattr(relay, "_connect", connect)
    hops = [FakeHop("a", {"next": "b", "ok": True}), FakeHop("b", {"next": "c", "ok": False,
                                                                   "error": "10.0.0.99:9000: timed out"}),
            FakeHop("c", {"next": "d", "ok": True}), FakeHop("d")]
    route = Route()
    chains = relay._chains(None, hops, False, route, end=1e18)
    assert [[h.name for h in chain] for chain, _ in chains] == [["a", "b"], ["c", "d"]] and opened == ["a", "c"]
    assert route.chains == [["a", "b"], ["c", "d"]] and route.via == {"a": "ssh", "c": "ssh"}
    assert route.notes == ["b cannot reach c on the data plane (10.0.0.99:9000: timed out): c begins another chain"]
    assert [h.upstream for h in hops] == ["this machine", "a", "this machine", "c"]
    # each chain's first hop got its token, then the rest of its chain (addresses, ports, tokens)
    assert hops[0].sent.decode().splitlines() == ["token-a", json.dumps({"route": [["b", "10.0.0.98", 9000, "token-b"],
                                                                                  ["c", "10.0.0.99", 9000, "token-c"],
                                                                                  ["d", "10.0.0.100", 9000, "token-d"]]})]
    assert hops[2].sent.decode().splitlines()[0] == "token-c"
