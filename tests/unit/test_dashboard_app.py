"""The dashboard's state (clusterctl/dashboard/state.py) on run directories made here, and its application served by
uvicorn on a free loopback port, asked over real HTTP: the token's guard, the JSON routes, the event stream and the
chat proxy (to a stand-in endpoint answering as mlx-lm's server does; the real one: tests/ssh/test_dashboard.py)."""
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clusterctl.dashboard.app import build, finite
from clusterctl.cli.hosttable import lines
from clusterctl.dashboard.state import Board, Curves, host_json, latest_stacks, picture, thin
from clusterctl.inventory import parse
from clusterctl.observe.record import PID_FILE, RANK_METRICS
from clusterctl.observe.telemetry import COLUMNS, HostTelemetry, assess

RUN = "20261127-101500-1a2b3c"


def cluster(backend: str, addresses: bool = True):
    hosts = "".join(f"  - name: m{i}\n    hostname: 10.0.0.{i}\n" + (f"    address: 192.168.{i}.1\n" if addresses else "")
                    for i in range(1, 4))
    return parse(f"launch:\n  backend: {backend}\nhosts:\n{hosts}")


def test_the_picture_links_the_ring_in_inventory_order_and_mpi_every_pair():
    ring = picture(cluster("ring"))
    assert [n["id"] for n in ring["nodes"]] == ["m1", "m2", "m3"] and ring["nodes"][0]["ssh"] == "10.0.0.1"
    assert [(x["a"], x["b"]) for x in ring["links"] if x["kind"] == "ssh"] == [("this machine", h) for h in ("m1", "m2", "m3")]
    assert [(x["a"], x["b"]) for x in ring["links"] if x["kind"] == "data"] == [("m1", "m2"), ("m2", "m3"), ("m3", "m1")]
    assert ring["links"][3]["label"] == "192.168.1.1 - 192.168.2.1"
    mpi = picture(cluster("mpi"))
    assert [(x["a"], x["b"]) for x in mpi["links"] if x["kind"] == "data"] == [("m1", "m2"), ("m1", "m3"), ("m2", "m3")]
    assert [x["kind"] for x in picture(cluster("ring", addresses=False))["links"]] == ["ssh"] * 3
    assert picture(None) == {"nodes": [], "links": []}


def test_the_hosts_rows_are_the_cells_top_prints_and_wait_for_their_first_sample(tmp_path):
    """The page draws the cells the server sends (telemetry.cells, what `top` prints), so the two never differ."""
    board = Board(str(tmp_path), cluster("ring"))              # no connector: never sampled
    hosts = board.overview()["hosts"]
    assert [(h["host"], h["state"], h["cells"][:2]) for h in hosts] == [(f"m{i}", "sampling", [f"m{i}", "sampling"])
                                                                         for i in (1, 2, 3)]
    assert len(hosts[0]["cells"]) == len(COLUMNS) == 11
    sample = assess(HostTelemetry("m1", taken=1.0, memory_used=24 * 1024 ** 3, memory_total=32 * 1024 ** 3,
                                  pressure="warn", swap_used=0, swap_total=2 * 1024 ** 3, load_1m=3.5, cores=10,
                                  gpu_percent=88.0, thermal="nominal", speed_limit=100, disk_free=500 * 1024 ** 3))
    [(_, _), (line, _)] = lines([sample])
    assert host_json(sample)["cells"] == ["m1", "ok", "24.0/32.0 GiB 75%", "warn", "0.0/2.0 GiB", "3.50/10", "88%",
                                           "nominal", "500.0 GiB", "0", "memory pressure warn"]
    assert line.split() == "m1 ok 24.0/32.0 GiB 75% warn 0.0/2.0 GiB 3.50/10 88% nominal 500.0 GiB 0 memory pressure warn".split()


def test_thin_keeps_at_most_the_limit_evenly_and_the_last_point():
    assert thin(list(range(10)), 20) == list(range(10))
    kept = thin(list(range(1000)), 11)
    assert len(kept) == 11 and kept[0] == 0 and kept[-1] == 999 and kept == sorted(kept)


def write_lines(path, records, tail=""):
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_curves_read_each_ranks_metrics_incrementally_and_again_when_the_file_is_replaced(tmp_path):
    path = tmp_path / RANK_METRICS
    write_lines(path, [{"t": 1, "rank": 0, "quiet_s": 600}, {"t": 2, "rank": 0, "step": 5, "total_steps": 20, "loss": 4.0,
                                                             "tokens_per_s": 100.0, "share": 0.5},
                       {"t": 2, "rank": 1, "step": 5, "loss": 4.0, "tokens_per_s": 90.0}],
                tail='{"t": 3, "rank": 0, "step": 10, "lo')          # a line still being written
    curves = Curves()
    curves.update(str(tmp_path))
    assert curves.ranks == {0: [{"step": 5, "loss": 4.0, "tokens_per_s": 100.0, "share": 0.5}],
                            1: [{"step": 5, "loss": 4.0, "tokens_per_s": 90.0}]}
    with open(path, "a") as f:
        f.write('ss": 3.0}\n' + json.dumps({"t": 4, "rank": 0, "step": 10, "val_loss": 3.5}) + "\nnot json\n")
    curves.update(str(tmp_path))
    assert [p["step"] for p in curves.ranks[0]] == [5, 10] and curves.ranks[0][1] == {"step": 10, "loss": 3.0}
    assert curves.held_out == [[10, 3.5]] and curves.latest[0]["total_steps"] == 20 and curves.latest[0]["val_loss"] == 3.5
    curves.update(str(tmp_path))                   # nothing new: nothing added
    assert len(curves.ranks[0]) == 2
    (tmp_path / "new").write_text(json.dumps({"t": 9, "rank": 0, "step": 1, "loss": 9.0}) + "\n")
    os.replace(tmp_path / "new", path)             # replaced (a new attempt's file, a copy): read from its start
    curves.update(str(tmp_path))
    assert curves.ranks == {0: [{"step": 1, "loss": 9.0}]} and curves.held_out == []


def test_a_run_without_rank_metrics_is_drawn_from_its_metrics_jsonl_as_one_curve(tmp_path):
    write_lines(tmp_path / "metrics.jsonl", [{"step": 1, "loss": 5.0, "tokens_per_s": 10.0}, {"step": 2, "val_loss": 4.5}])
    curves = Curves()
    curves.update(str(tmp_path))
    assert curves.ranks == {-1: [{"step": 1, "loss": 5.0, "tokens_per_s": 10.0}]} and curves.held_out == [[2, 4.5]]


def test_latest_stacks_are_the_newest_folders_rank_files(tmp_path):
    assert latest_stacks(str(tmp_path)) is None
    for stamp, text in (("20261127-101501", "old"), ("20261127-101502", "new")):
        folder = tmp_path / "stacks" / stamp
        folder.mkdir(parents=True)
        (folder / "rank-0.txt").write_text(f"{text} 0")
        (folder / "rank-1.txt").write_text(f"{text} 1")
    assert latest_stacks(str(tmp_path)) == {"taken": "20261127-101502", "ranks": {0: "new 0", 1: "new 1"}}


def test_finite_makes_nan_and_infinities_null_at_any_depth():
    assert finite({"a": [1.0, float("nan"), {"b": float("inf")}], "c": "x", "d": 2}) == \
        {"a": [1.0, None, {"b": None}], "c": "x", "d": 2}


# -- the application over HTTP ----------------------------------------------------------------------------------

class Endpoint(BaseHTTPRequestHandler):
    """A stand-in for mlx-lm's server: /health, and a chat completion that says what it was asked."""
    asked: list = []

    def do_GET(self):
        self._answer(200, {"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Endpoint.asked.append(body)
        self._answer(200, {"model": body["model"], "choices": [{"message": {
            "role": "assistant", "content": f"you said {body['messages'][-1]['content']}"}}]})

    def _answer(self, status, doc):
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def served(tmp_path, monkeypatch):
    """The dashboard of a runs/ holding one finished training run and one running serve (its endpoint the
    stand-in), on a free port: (base URL, token)."""
    import uvicorn

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))      # the runs index read: this test's own
    runs = tmp_path / "runs"
    train = runs / RUN
    train.mkdir(parents=True)
    (train / "launch.json").write_text(json.dumps({"rank_hosts": ["m1", "m2"], "backend": "ring"}))
    (train / "summary.json").write_text(json.dumps({"run_id": RUN, "exit_code": 0, "outcome": "ok", "reason": "done",
                                                    "hosts": ["m1", "m2"], "world": 2, "kind": "train"}))
    write_lines(train / RANK_METRICS, [{"t": 1, "rank": r, "step": s, "loss": 5.0 - s / 10, "tokens_per_s": 100.0}
                                       for s in (5, 10) for r in (0, 1)] + [{"t": 2, "rank": 0, "step": 10, "val_loss": float("nan")}])
    endpoint = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    serve_id = "20261127-101600-4d5e6f"
    serve_dir = runs / serve_id
    serve_dir.mkdir()
    (serve_dir / PID_FILE).write_text(f"{os.getpid()} {socket.gethostname()}\n")     # alive: this process
    index = tmp_path / "cache" / "clusterctl" / "runs.jsonl"
    index.parent.mkdir(parents=True)
    url = f"http://127.0.0.1:{endpoint.server_address[1]}"
    write_lines(index, [{"event": "start", "run_id": serve_id, "dir": str(serve_dir), "kind": "serve",
                         "service": {"url": url, "model": "tiny"}}])
    board = Board(str(runs), interval=0.5)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(build(board, "sesame", stream_s=0.2), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/", "sesame", serve_id
    server.should_exit = True
    thread.join(10)
    board.close()
    endpoint.shutdown()


def ask(url, body=None, headers=None):
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_every_route_but_the_static_files_needs_the_token(served):
    base, token, _ = served
    for path in ("", "api/overview", f"api/run/{RUN}", "api/stream"):
        status, body = ask(base + path)
        assert status == 403 and b"token" in body, path
        assert ask(base + path + "?token=sesamE")[0] == 403
    assert ask(base + f"api/chat/{RUN}", {"messages": []})[0] == 403
    assert ask(base + f"?token={token}")[0] == 200
    assert ask(base + "api/overview", headers={"X-Clusterctl-Token": token})[0] == 200
    status, script = ask(base + "static/dashboard.js")
    assert status == 200 and b"EventSource" in script
    assert ask(base + "static/uPlot.iife.min.js")[0] == 200


def test_the_overview_and_a_runs_curves(served):
    base, token, serve_id = served
    status, body = ask(base + f"api/overview?token={token}")
    doc = json.loads(body)
    assert status == 200 and doc["hosts"] == [] and doc["picture"] == {"nodes": [], "links": []}
    rows = {r["run_id"]: r for r in doc["runs"]}
    assert rows[RUN]["status"] == "ok" and rows[RUN]["final_loss"] is None and rows[serve_id]["status"] == "running"
    assert [(e["run_id"], e["model"]) for e in doc["endpoints"]] == [(serve_id, "tiny")]
    status, body = ask(base + f"api/run/{RUN}?token={token}")
    run = json.loads(body)          # the NaN held-out loss came through as null, valid JSON
    assert [(r["rank"], r["host"], r["step"], [p["step"] for p in r["curve"]]) for r in run["ranks"]] == \
        [(0, "m1", 10, [5, 10]), (1, "m2", 10, [5, 10])]
    assert run["held_out"] == [[10, None]] and run["run"]["outcome"] == "exit 0: done" and run["stacks"] is None
    assert ask(base + f"api/run/20991231-000000-000000?token={token}")[0] == 404
    assert ask(base + f"api/run/..%2F..%2Fetc?token={token}")[0] == 404


def test_the_stream_sends_the_overview_and_the_watched_run(served):
    base, token, _ = served
    with urllib.request.urlopen(base + f"api/stream?token={token}&run={RUN}", timeout=10) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        events = []
        while len(events) < 4:
            line = stream.readline().decode()
            if line.startswith("event: "):
                events.append(line.split()[1])
    assert events == ["overview", "run", "overview", "run"]


def test_the_chat_goes_to_a_running_serves_endpoint_with_its_own_model_only(served):
    base, token, serve_id = served
    Endpoint.asked.clear()
    status, body = ask(base + f"api/chat/{serve_id}?token={token}",
                       {"messages": [{"role": "user", "content": "hello"}], "model": "someone/else"})
    assert status == 200 and json.loads(body)["content"] == "you said hello"
    assert [a["model"] for a in Endpoint.asked] == ["tiny"]       # the served model, whatever the page sends
    status, body = ask(base + f"api/chat/{RUN}?token={token}", {"messages": [{"role": "user", "content": "x"}]})
    assert status == 502 and "no running endpoint" in json.loads(body)["error"]
    assert ask(base + f"api/chat/{serve_id}?token={token}", b"not json")[0] == 400
    status, body = ask(base + f"api/chat/{serve_id}?token={token}", {"messages": [{"role": "root", "content": 1}]})
    assert status == 502 and "messages" in json.loads(body)["error"]
    assert ask(base + f"api/chat/{serve_id}?token={token}", b"x" * (65 * 1024))[0] == 413
    assert len(Endpoint.asked) == 1
