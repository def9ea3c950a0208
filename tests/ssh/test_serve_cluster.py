"""`clusterctl serve` on two test hosts as a user runs it: a small mlx-lm model made here (tests/lmfixture.py, nothing
downloaded), hosts with empty HOMEs (the inventory-only cluster: no Hugging Face cache, an empty model store), the
URL on this machine's loopback carried over SSH to rank 0's. Over ring and over mpi: the URL is printed once a
completion is answered, /v1/models lists the model and a chat completion is answered; with --max-restarts 1,
killing rank 1's process brings the endpoint back; Ctrl-C leaves no process on any host and frees the port. A
second serve of the same model moves no model bytes and leaves the store's files untouched. What cannot be served
(or would be listened for where the URL cannot reach, or names serve's own options after `--`, abbreviated) is
refused in one line with nothing started. A request naming another model, an adapter or a draft model is a 404
that loads nothing (no hub cache appears on any host); replies name the served model; a run's result is served
under its source model's name and its run."""
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from functools import partial

import clirun
import pytest

pytest.importorskip("mlx_lm")

import lmfixture  # noqa: E402
from sshcluster import free_port  # noqa: E402
from test_live_panel import Tmux, wait_for  # noqa: E402
from throttle import Throttle, ssh_config_text  # noqa: E402

from clusterctl.trainer_contract import EXPORT_MARKER  # noqa: E402

pytestmark = pytest.mark.ssh
READY = re.compile(r"serve: ready at (http://\S+) \(model (\S+)\)")


class Served:
    """A `clusterctl serve` running in the background, its output collected line by line."""

    def __init__(self, *args, cwd, env, proc=None):
        self.proc = proc or clirun.start("serve", *args, cwd=cwd, env=env, own_cache=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    @classmethod
    def following(cls, proc) -> "Served":
        """Another clusterctl process (attach), its output collected the same way."""
        return cls(cwd=None, env=None, proc=proc)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def ready(self, count: int = 1, timeout: float = 240) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [m for m in map(READY.search, list(self.lines)) if m]
            if len(found) >= count:
                return found[count - 1]
            assert self.proc.poll() is None, self.text[-4000:]
            time.sleep(0.2)
        raise AssertionError(f"not ready {count} time(s) in {timeout}s:\n{self.text[-4000:]}")

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(60)
        self.reader.join(10)
        return code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def http(url: str, body: dict | None = None, timeout: float = 120):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.status, json.loads(answer.read())


def chat(url: str, model: str) -> str:
    status, answer = http(url + "/v1/chat/completions", {"model": model, "max_tokens": 4,
                                                         "messages": [{"role": "user", "content": "Tom found"}]})
    assert status == 200
    return answer["choices"][0]["message"]["content"]


def port_is_free(port: int) -> bool:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def run_processes(run_id: str) -> str:
    found = subprocess.run(["pgrep", "-af", f"clusterctl-ru[n]-{run_id}"], capture_output=True, text=True)
    return found.stdout


def serving_ranks(*paths) -> str:
    """The serving ranks' processes whose command line names one of `paths` (this test's cluster, its model: other
    developers' serve tests may run on this machine at the same time)."""
    found = subprocess.run(["pgrep", "-af", "clusterctl[.]serve[.]rank"], capture_output=True, text=True).stdout
    return "".join(line + "\n" for line in found.splitlines() if any(str(p) in line for p in paths))


def rank_pid(cluster, index: int, run_id: str) -> int:
    """The pid of the rank's python on host `index` (the bootstrap: `python -c "#clusterctl-run-<id>...`)."""
    for pid in cluster.session_pids(index):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[1] == b"-c" and argv[2].startswith(f"#clusterctl-run-{run_id}".encode()):
            return pid
    raise AssertionError(f"no rank of {run_id} on h{index}")


def store_files(cluster) -> dict[str, tuple[int, int]]:
    """Every file of every host's model store: path -> (inode, mtime_ns)."""
    found = {}
    for host in cluster.hosts:
        root = host.dir / "home" / ".cache" / "clusterctl" / "models"
        for path in root.rglob("*"):
            if path.is_file():
                st = path.stat()
                found[str(path)] = (st.st_ino, st.st_mtime_ns)
    return found


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return lmfixture.make_model(tmp_path_factory.mktemp("served") / "tiny")


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_served_on_two_hosts_answers_comes_back_after_a_rank_dies_and_stops_cleanly(make_cluster, model, tmp_path,
                                                                                   backend):
    cluster = make_cluster(2, inventory_only=True)
    port = free_port("127.0.0.1")
    serve = partial(Served, str(model), "--hosts", str(cluster.inventory), "--backend", backend, "--port", str(port),
                    cwd=tmp_path, env=cluster.client_env())
    served = serve("--max-restarts", "1", "--restart-delay", "1")
    try:
        url, model_id = served.ready().groups()
        assert url == f"http://127.0.0.1:{port}"
        for host in cluster.hosts:          # fresh hosts: mlx-lm would answer /v1/models with an empty body
            assert not (host.dir / "home" / ".cache" / "huggingface").exists()
        status, listed = http(url + "/v1/models")
        assert status == 200 and [m["id"] for m in listed["data"]] == [model_id] == ["tiny"], listed
        assert chat(url, model_id)
        run_id = clirun.TOKEN.search(served.text).group(1)
        listed = clirun.clusterctl("ps", "--hosts", str(cluster.inventory), cwd=tmp_path, env=cluster.client_env(),
                                   own_cache=True)
        rows = [line for line in listed.stdout.splitlines() if run_id in line]
        assert rows and rows[0].endswith(url) and not any(url in row for row in rows[1:]), listed.stdout
        os.kill(rank_pid(cluster, 2, run_id), signal.SIGKILL)
        killed = time.monotonic()
        served.ready(count=2, timeout=60)
        assert time.monotonic() - killed < 60
        assert chat(url, model_id)
        assert served.interrupt() == 130, served.text[-3000:]
    finally:
        served.kill()
    assert f"{url} is closed" in served.text
    assert port_is_free(port) and run_processes(run_id) == ""
    summary = json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())
    assert summary["service"]["url"] == url and summary["restarts"] == 1
    assert [a["outcome"] for a in summary["attempts"]] == ["failed", "stopped"]
    # runs says what it was, and a serve stopped as intended is stopped, not "exit 130"
    listed = {r["run_id"]: r for r in json.loads(clirun.clusterctl("runs", "--json", cwd=tmp_path, own_cache=True).stdout)}
    assert {k: listed[run_id][k] for k in ("kind", "model", "strategy", "world", "status")} == \
        {"kind": "serve", "model": "tiny", "strategy": "tensor", "world": 2, "status": "stopped"}, listed[run_id]
    if backend != "ring":
        return
    # the same model again: nothing moves, the store's files are untouched, and it is ready sooner; stopped this
    # time with `clusterctl kill`, which stops it through serve's own process: no restart, recorded as stopped
    before = store_files(cluster)
    again = serve("--max-restarts", "1")
    try:
        again.ready()
        second = clirun.TOKEN.search(again.text).group(1)
        killed = clirun.clusterctl("kill", second, "--hosts", str(cluster.inventory), cwd=tmp_path,
                                   env=cluster.client_env(), own_cache=True)
        assert killed.returncode == 0 and "no process left" in killed.stderr, killed.stderr
        assert again.proc.wait(60) == 143, again.text[-3000:]
    finally:
        again.kill()
    assert again.text.count("has it already") == 2 and "sent, verified" not in again.text, again.text[-3000:]
    assert store_files(cluster) == before and before
    assert "restarting" not in again.text and run_processes(second) == "" and port_is_free(port)
    row = next(r for r in json.loads(clirun.clusterctl("runs", "--json", cwd=tmp_path, own_cache=True).stdout)
               if r["run_id"] == second)
    assert (row["status"], row["kind"], row["exit_code"]) == ("stopped", "serve", 143), row


def completion(url: str, model: str) -> str:
    status, answer = http(url + "/v1/completions", {"model": model, "prompt": "What is the capital", "max_tokens": 8,
                                                    "temperature": 0, "seed": 0})
    assert status == 200
    return answer["choices"][0]["text"]


def test_adapters_a_run_trained_are_served_on_their_base_fused_once(make_cluster, model, tmp_path):
    """`serve BASE --adapter RUN`: the run's adapters fused into BASE on this machine (mlx-lm's distributed server
    loads none), served on two hosts: the same prompt and seed get another completion than BASE alone; a second
    serve fuses nothing and moves no model bytes; adapters trained on another model are refused in one line."""
    import subprocess
    import sys

    cluster = make_cluster(2, inventory_only=True)
    env = cluster.client_env()
    data = lmfixture.make_data(tmp_path / "data", "text", valid=False)
    trained = subprocess.run([sys.executable, "-m", "clusterctl", "run", "--plain", "--", "--model", str(model),
                              "--adapter", "lora", "--data", str(data), "--steps", "20", "--batch-size", "4",
                              "--max-seq-length", "64", "--lr", "2e-2", "--warmup", "2", "--eval-every", "0"],
                             capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run_id = clirun.TOKEN.search(trained.stderr).group(1)
    port = free_port("127.0.0.1")
    answers = {}
    for what in (["--adapter", run_id], [], ["--adapter", "latest"]):
        served = Served(str(model), "--hosts", str(cluster.inventory), "--backend", "ring", "--port", str(port), *what,
                        cwd=tmp_path, env=env)
        try:
            url, model_id = served.ready().groups()
            answers.setdefault(model_id, []).append(completion(url, model_id))
            assert served.interrupt() == 130
        finally:
            served.kill()
        if what:
            assert model_id == f"tiny+{run_id}"
            assert ("fused into it now" if what[1] == run_id else "fused before: reused") in served.text
        if what[1:] == ["latest"]:          # the same fused model: already in both hosts' stores
            assert served.text.count("has it already") == 2, served.text[-3000:]
    adapted, plain = answers[f"tiny+{run_id}"], answers["tiny"]
    assert adapted[0] == adapted[1] and adapted[0] != plain[0], answers
    other = lmfixture.make_model(tmp_path / "other", "qwen3")
    r = clirun.clusterctl("serve", str(other), "--adapter", run_id, "--hosts", str(cluster.inventory), "--port",
                          str(port), cwd=tmp_path, env=env, own_cache=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "was trained on another model than" in r.stderr and "model_type llama there, qwen3 here" in r.stderr


def test_what_cannot_be_served_is_refused_in_one_line_with_nothing_started(make_cluster, model, tmp_path):
    cluster = make_cluster(2, inventory_only=True)
    (tmp_path / "odd").mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "odd" / name).write_bytes((model / name).read_bytes())
    (tmp_path / "odd" / "config.json").write_text(json.dumps({**json.loads((model / "config.json").read_text()),
                                                              "model_type": "no_such_arch"}))
    (tmp_path / "data").mkdir()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    busy = taken.getsockname()[1]
    h1 = cluster.hosts[0].address
    on_h1 = socket.socket()
    on_h1.bind((h1, 0))
    on_h1.listen(1)
    try:
        for args, says in [(["data"], "data is not an mlx-lm model directory: it has no config.json"),
                           (["odd"], "odd: mlx-lm cannot load this no_such_arch model"),
                           ([str(model), "--port", str(busy)], f"port {busy} on 127.0.0.1 is in use on this machine"),
                           ([str(model), "--listen", h1, "--port", str(on_h1.getsockname()[1])],
                            f"port {on_h1.getsockname()[1]} on {h1} is in use on {h1}"),
                           ([str(model), "--", "--port", "9"], "--port after `--`: serve sets it"),
                           # mlx-lm's argparse takes an abbreviation: rank 0 would listen on every address
                           ([str(model), "--", "--hos", "0.0.0.0"],
                            "--hos after `--`: mlx-lm's server may take it for --host, which serve sets"),
                           ([str(model), "--listen", "10.9.9.9"], f"--listen 10.9.9.9 is not an address of {h1} (it "
                                                                  "has 127.0.0.1"),
                           ([str(model), "--listen", "127.0.0.1"], f"--listen 127.0.0.1 is {h1}'s own loopback")]:
            r = clirun.clusterctl("serve", "--hosts", str(cluster.inventory), *args, cwd=tmp_path,
                                  env=cluster.client_env(), own_cache=True, timeout=120)
            errors = [line for line in r.stderr.splitlines() if line.strip()]
            assert r.returncode == 2 and len(errors) == 1 and says in errors[0], r.stderr
            assert not (tmp_path / "runs").exists() and serving_ranks(cluster.hosts[0].dir.parent, model) == ""
    finally:
        taken.close()
        on_h1.close()


def test_listen_exposes_the_server_on_a_host_address_with_a_warning(make_cluster, model, tmp_path):
    """Also (issue 44 items 5 and 6, issue 41): MODEL is a Hugging Face model named by its id, the hub offline: the
    hub cache's snapshot (links into its blobs) is served, sent over SFTP; `models rm` of the model being served is refused in one line naming the run, and the server answers on;
    `models rm --force` stops the run, as `clusterctl kill` does, and removes it."""
    cluster = make_cluster(2, inventory_only=True)
    h1 = cluster.hosts[0].address
    port = free_port(h1)
    lmfixture.hub_snapshot(model, tmp_path / "hf", "tiny-org/tiny")
    env = {**cluster.client_env(), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    served = Served("tiny-org/tiny", "--hosts", str(cluster.inventory), "--backend", "ring", "--listen", h1, "--port",
                    str(port), "--method", "sftp", "--", "--max-tokens", "2", cwd=tmp_path, env=env)
    rm = partial(clirun.clusterctl, "models", "rm", "tiny-org/tiny", "--hosts", str(cluster.inventory), cwd=tmp_path,
                 env=env, own_cache=True, timeout=120)
    try:
        url, model_id = served.ready().groups()
        assert url == f"http://{h1}:{port}" and "no authentication" in served.text and model_id == "tiny-org/tiny"
        assert chat(url, model_id) and port_is_free(port)       # nothing of this machine listens on the port
        # the server's own options pass through after `--`: its default --max-tokens, for a request with none; the
        # reply names the served model, though the request named none
        status, answer = http(url + "/v1/completions", {"prompt": "Tom found", "temperature": 0.0})
        assert status == 200 and answer["usage"]["completion_tokens"] == 2, answer
        assert answer["model"] == model_id
        # a request naming another model, an adapter or a draft model loads nothing: 404, naming the served model
        for body in ({"model": "other"}, {"model": "mlx-community/Qwen3-0.6B-4bit"}, {"model": str(model.parent)},
                     {"adapters": "/tmp"}, {"draft_model": "mlx-community/Qwen3-0.6B-4bit"}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                http(url + "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "Tom"}]})
            error = json.loads(refused.value.read())["error"]
            assert refused.value.code == 404 and f'serves only "{model_id}"' in str(error), (body, error)
        assert chat(url, model_id)                              # and the served model was never let go
        for host in cluster.hosts:
            assert not (host.dir / "home" / ".cache" / "huggingface").exists()
        # the model in use cannot be removed from under the server
        entries = [e for host in cluster.hosts for e in (host.dir / "home/.cache/clusterctl/models").glob("tiny-org-tiny-*")]
        assert len(entries) == 2 and all(not p.is_symlink() for e in entries for p in e.iterdir()), entries
        run_id = clirun.TOKEN.search(served.text).group(1)
        refused = rm()
        errors = [line for line in refused.stderr.splitlines() if line.strip()]
        assert refused.returncode == 1 and len(errors) == 1, refused.stderr
        assert f"is in use: run {run_id} on " in errors[0] and "give --force to stop it" in errors[0], errors
        assert all((e / "config.json").is_file() for e in entries) and chat(url, model_id)     # it answers on
        forced = rm("--force")
        assert forced.returncode == 0 and forced.stdout.count("removed") == 2, forced.stdout + forced.stderr
        served.proc.wait(60)                       # the run stopped: serve ends on its own
    finally:
        served.kill()
    assert not any(e.exists() for e in entries) and run_processes(run_id) == "" and port_is_free(port)


def test_pipeline_stages_get_only_their_weight_files_and_answer(make_cluster, tmp_path):
    cluster = make_cluster(2, inventory_only=True)
    staged = lmfixture.make_model(tmp_path / "staged", "qwen2", layers=4, files=4)
    # a run's result: served under its source model's name and its run (the marker export and the trainer write)
    (staged / EXPORT_MARKER).write_text(json.dumps({"run": "20261126-101500-ab12cd", "model": "models/Qwen2-base",
                                                    "step": 40}))
    # as a Hugging Face snapshot (issue 44 item 6: its links went over rsync as links, and the push failed)
    staged = lmfixture.hub_snapshot(staged, tmp_path / "hf", "tiny-org/staged")
    served = Served(str(staged), "--hosts", str(cluster.inventory), "--backend", "ring", "--pipeline", "--port",
                    str(free_port("127.0.0.1")), cwd=tmp_path, env=cluster.client_env())
    try:
        url, model_id = served.ready().groups()
        assert model_id == "Qwen2-base-ft-20261126-101500-ab12cd" and chat(url, model_id)
        assert served.interrupt() == 130
    finally:
        served.kill()
    held = {}
    for host in cluster.hosts:
        [entry] = (host.dir / "home" / ".cache" / "clusterctl" / "models").glob("tiny-org-staged-*")
        held[host.name] = sorted(p.name for p in entry.glob("*.safetensors"))
    f = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    # rank 0 (the first host) runs blocks 2 and 3, rank 1 blocks 0 and 1; both need the embedding and the head
    assert held == {cluster.hosts[0].name: [f[0], f[2], f[3]], cluster.hosts[1].name: [f[0], f[1], f[3]]}, held


def test_an_endpoint_that_stops_answering_while_its_ranks_live_is_a_stall_and_is_restarted(make_cluster, model,
                                                                                            tmp_path):
    cluster = make_cluster(2, inventory_only=True)
    port = free_port("127.0.0.1")
    served = Served(str(model), "--hosts", str(cluster.inventory), "--backend", "ring", "--port", str(port),
                    "--stall-timeout", "8", "--max-restarts", "1", "--restart-delay", "1", cwd=tmp_path,
                    env=cluster.client_env())
    try:
        url, model_id = served.ready().groups()
        run_id = clirun.TOKEN.search(served.text).group(1)
        frozen = rank_pid(cluster, 1, run_id)        # rank 0: its HTTP server stops answering, its process lives
        os.kill(frozen, signal.SIGSTOP)
        served.ready(count=2, timeout=120)
        assert "stalled: the endpoint has not answered a health request for" in served.text, served.text[-3000:]
        assert chat(url, model_id)
        assert served.interrupt() == 130
    finally:
        served.kill()
    summary = json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())
    assert [a["outcome"] for a in summary["attempts"]] == ["stalled", "stopped"], summary["attempts"]
    assert run_processes(run_id) == "" and port_is_free(port)


BAR = re.compile(r"^store: (h\d) +\[#* *\] +(\d+)% ")                        # console.Bars, on a terminal
PLAIN = re.compile(r"^store: (h\d): [\d.]+ [KM]iB of [\d.]+ MiB \((\d+)%\), .*/s, \d+ s left$")   # off one


def test_a_model_on_its_way_shows_each_hosts_progress_on_a_terminal_and_off_one(make_cluster, model, tmp_path):
    """Issue 41: while serve pushes a model not yet in the stores, a terminal (tmux) shows a bar per host that moves;
    a pipe gets a plain line per host every 5 s. The push is held to 2 MB/s from this machine (tests/throttle.py,
    the stand-in for a laptop on Wi-Fi) so that it lasts; the route is printed first."""
    cluster = make_cluster(2)
    throttle = Throttle(rate=2e6).start()
    tmux = Tmux(f"clusterctl-serve-{os.getpid()}", session="serve")
    served = None
    try:
        for h in cluster.hosts:
            throttle.add(h.name, (h.address, h.port))
        cluster.ssh_config.write_text(ssh_config_text(cluster, throttle))
        for name in ("on-a-terminal", "off-one"):          # two models: each push starts from empty stores
            shutil.copytree(model, tmp_path / name)
            (tmp_path / name / "notes.bin").write_bytes(os.urandom(12 << 20))
        env = {"XDG_CACHE_HOME": str(tmp_path / ".cache"), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        command = (f"cd {shlex.quote(str(tmp_path))} && env {' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())} "
                   f"{shlex.quote(sys.executable)} -m clusterctl serve on-a-terminal --port {free_port('127.0.0.1')} "
                   f"--hosts {shlex.quote(str(cluster.inventory))}; echo EXIT=$?; sleep 600")
        assert tmux("new-session", "-d", "-s", "serve", "-x", "160", "-y", "40", command).returncode == 0
        seen: dict[str, set[int]] = {"h1": set(), "h2": set()}

        def moving(lines):
            for m in filter(None, map(BAR.match, lines)):
                seen[m.group(1)].add(int(m.group(2)))
            return all(len(p - {0, 100}) >= 2 for p in seen.values())      # two moments mid-way, per host

        lines = wait_for(tmux, moving, 90)
        assert "store: relay: this machine -(ssh)-> h1 -> h2" in lines, lines
        tmux("send-keys", "-t", "serve", "C-c")
        wait_for(tmux, lambda ls: any(line.startswith("EXIT=") for line in ls), 90)

        served = Served("off-one", "--port", str(free_port("127.0.0.1")), "--hosts", str(cluster.inventory),
                        cwd=tmp_path, env=None)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and {m.group(1) for m in map(PLAIN.match, served.lines) if m} != {"h1", "h2"}:
            assert served.proc.poll() is None, served.text[-3000:]
            time.sleep(0.2)
        plain = [m for m in map(PLAIN.match, served.lines) if m]
        assert {m.group(1) for m in plain} == {"h1", "h2"}, served.text[-3000:]
        assert not any("\x1b[" in line for line in served.lines)               # no bars drawn into a pipe
        served.interrupt()
    finally:
        if served is not None:
            served.kill()
        tmux.close()
        throttle.stop()


def test_a_detached_server_answers_with_nothing_of_this_machine_left_restarts_alone_and_kill_stops_it(
        make_cluster, model, tmp_path):
    """serve --detach (issue 54): the model stored from here, the server handed to a supervisor on h1 that serves
    on h1's address; with every process of this machine for it killed, it answers, a rank killed is restarted by
    the supervisor, `attach` says it was ready and Ctrl-C leaves it serving, `runs` shows it, and `kill` from a
    machine without its record stops it through its supervisor: the port closed, no rank left; its run directory
    comes home here on the next `runs`, recorded as stopped."""
    from test_detach import kill_this_machine, wait_until

    # own_route: this machine reaches the hosts by addresses of its own, as another machine would, so no connection
    # of this machine's is one the hosts' own ssh shares (a master connection), which kill_this_machine would cut
    cluster = make_cluster(2, own_route=True)
    h1 = cluster.hosts[0].address
    port = free_port(h1)
    url = f"http://{h1}:{port}"
    env = cluster.client_env()
    began = time.monotonic()
    detached = clirun.clusterctl("serve", str(model), "--hosts", str(cluster.inventory), "--backend", "ring", "--detach",
                                 "--listen", h1, "--port", str(port), "--max-restarts", "1", "--restart-delay", "1",
                                 "--", "--max-tokens", "2", cwd=tmp_path, env=env, own_cache=True, timeout=180)
    assert detached.returncode == 0, detached.stderr[-3000:]
    returned = time.monotonic() - began
    run_id = detached.stdout.strip().splitlines()[-1]
    assert (f"serve {run_id}: detached; its supervisor runs on h1" in detached.stderr
            and f"it answers at {url} once ready" in detached.stderr), detached.stderr
    kill_this_machine(cluster, tmp_path)               # the laptop's lid closes: nothing of it serves
    ready = f"serve: ready at {url} (model tiny)"
    log = partial(_supervisor_log, cluster, run_id)
    wait_until(lambda: "the detached server's ready line:\n" + log()[-4000:], lambda: log().count(ready) == 1,
               limit=180)
    status, listed = http(url + "/v1/models")
    assert [m["id"] for m in listed["data"]] == ["tiny"] and chat(url, "tiny")
    # a rank killed: its supervisor on h1 restarts the server, this machine's part in it nothing
    os.kill(rank_pid(cluster, 2, run_id), signal.SIGKILL)
    wait_until(lambda: "ready again after the restart:\n" + log()[-4000:],
               lambda: "restart 1 of 1" in log() and log().count(ready) == 2, limit=180)
    try:
        assert chat(url, "tiny")
    except OSError as e:
        raise AssertionError(f"{e}; the supervisor's log:\n{log()[-6000:]}") from None
    # attach: everything it printed, both ready lines among it, then Ctrl-C leaves it serving
    follower = Served.following(clirun.start("attach", run_id, "--plain", cwd=tmp_path, env=env, own_cache=True))
    wait_until(lambda: "attach's ready lines:\n" + follower.text[-3000:], lambda: follower.text.count(ready) == 2,
               limit=60)
    assert follower.interrupt() == 0 and f"attach: detached from run {run_id}" in follower.text, follower.text[-2000:]
    assert chat(url, "tiny")                           # Ctrl-C in attach left it serving
    listed = clirun.clusterctl("runs", cwd=tmp_path, env=env, own_cache=True)
    assert re.search(rf"{run_id} .* running \(detached, on h1\)", listed.stdout), listed.stdout
    # `kill` from a machine with no record of it (another laptop: the inventory, no runs/ of it) stops it through
    # its supervisor all the same, found by `ps` on h1: it stops its ranks and restarts nothing
    elsewhere = tmp_path / "another-laptop"
    elsewhere.mkdir()
    killed = clirun.clusterctl("kill", run_id, "--hosts", str(cluster.inventory), cwd=elsewhere, env=env,
                               own_cache=True, timeout=180)
    assert killed.returncode == 0 and f"kill: run {run_id}: no process left on 2 host(s)" in killed.stderr, \
        killed.stderr[-3000:]
    assert not _answers(url) and serving_ranks(cluster.hosts[0].dir.parent, model) == ""
    rows = {r["run_id"]: r for r in json.loads(clirun.clusterctl("runs", "--json", cwd=tmp_path, own_cache=True).stdout)}
    assert {k: rows[run_id][k] for k in ("kind", "model", "world", "status")} == \
        {"kind": "serve", "model": "tiny", "world": 2, "status": "stopped"}, rows[run_id]
    summary = json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())       # home with that `runs`
    assert summary["service"]["url"] == url and summary["restarts"] == 1, summary
    assert returned < 120, returned         # the model's copy to 2 stores and the hand-over, no serving


def _answers(url: str) -> bool:
    try:
        return http(url + "/health", timeout=5)[0] == 200
    except (OSError, ValueError):
        return False


def _supervisor_log(cluster, run_id: str) -> str:
    return cluster.ssh(1, f"cat {cluster.workdir}/.clusterctl/detached/{run_id}/supervisor.log").stdout
