"""Detached runs' pure parts and host scripts, run here for real (clusterctl/detach/, hosts/scripts/detach.py and
follow.py): the supervisor's words (run's and serve's), the handoff, the keeper that outlives its command, following
its output."""
import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from clusterctl.cli import serve as serve_cli
from clusterctl.cli.launch import run_cmd
from clusterctl.cli.runwords import RunCommand, split_run_words, supervisor_argv
from clusterctl.detach import follow, handoff
from clusterctl.errors import UsageError
from clusterctl.hosts.scripts import program
from clusterctl.inventory import parse

INVENTORY = """\
defaults:
  user: me
  mesh_identity_file: ~/.ssh/clusterctl_mesh
  env:
    HF_TOKEN: !secret hf_abc
hosts:
  - name: mini1
    hostname: 10.0.0.1
    identity_file: /nonexistent/laptop_key
    address: 192.168.2.1
    slots: 2
  - name: mini2
    port: 2222
    address: 192.168.2.2
launch:
  backend: ring
"""


def words(*argv):
    assert isinstance(run_cmd, RunCommand)
    return split_run_words(list(argv), run_cmd.takes_value())


def test_the_supervisor_gets_the_runs_own_options_less_what_applies_here_and_the_program_as_given():
    w = words("--hosts", "inv.yaml", "--detach", "--supervisor=mini2", "--env", "HF_TOKEN", "--max-restarts", "2",
              "--stall-timeout=30", "--runs-dir", "elsewhere", "--data", "shards", "train.py", "--lr", "3e-4", "--env")
    got = supervisor_argv(w, run_cmd.takes_value(), ".clusterctl/detached")
    assert got == ["--max-restarts", "2", "--stall-timeout=30", "--no-sync", "--no-stdin", "--plain", "--runs-dir",
                   ".clusterctl/detached", "train.py", "--lr", "3e-4", "--env"]     # the program's --env is its own
    bundled = supervisor_argv(words("--detach", "--", "--steps", "100"), run_cmd.takes_value(), "d")
    assert bundled[-3:] == ["--", "--steps", "100"]
    module = supervisor_argv(words("--detach", "-m", "mlx_lm", "lora", "--train"), run_cmd.takes_value(), "d")
    assert module[-4:] == ["-m", "mlx_lm", "lora", "--train"]


def test_a_detached_servers_supervisor_gets_the_stored_model_its_name_and_every_option_but_what_applies_here():
    ctx = serve_cli.serve_cmd.make_context("serve", [
        "mlx-community/Qwen3-4B-4bit", "--hosts", "inv.yaml", "--detach", "--supervisor", "mini2", "--listen",
        "0.0.0.0", "--port", "9000", "--max-restarts", "2", "--pipeline", "--adapter", "latest", "--method", "sftp",
        "--direct", "--name", "given", "--runs-dir", "elsewhere", "--", "--max-tokens", "20"])
    got = serve_cli.supervisor_argv(ctx.command, ctx.params, "/store/qwen", "qwen+adapters", ".clusterctl/detached")
    assert got[:5] == ["/store/qwen", "--name", "qwen+adapters", "--runs-dir", ".clusterctl/detached"]
    assert got[-3:] == ["--", "--max-tokens", "20"]
    options = [w for w in got[5:-3] if w.startswith("--")]
    for here_only in ("--hosts", "--detach", "--supervisor", "--adapter", "--method", "--direct", "--verify",
                      "--handoff"):
        assert here_only not in options, got          # done here (the model's copy, its fuse) or this machine's
    assert options.count("--name") == 0 and options.count("--runs-dir") == 0    # given once, first
    assert "--pipeline" in options
    at = {w: got[got.index(w) + 1] for w in ("--listen", "--port", "--max-restarts", "--restart-delay", "--launch-from")}
    assert at == {"--listen": "0.0.0.0", "--port": "9000", "--max-restarts": "2", "--restart-delay": "10.0",
                  "--launch-from": "auto"}
    again = serve_cli.serve_cmd.make_context("serve", got)         # what the supervisor parses is serve's own line
    assert again.params["listen"] == "0.0.0.0" and again.params["server_args"] == ("--max-tokens", "20")
    assert again.params["stall_timeout"] is None and again.params["name"] == "qwen+adapters"


def test_kill_all_stops_through_their_supervisors_the_detached_runs_on_the_inventorys_hosts_not_yet_home(tmp_path):
    """follow.waiting_on: a record of runs/ whose cluster shares a host (address and port) with the inventory's,
    not yet home; not one home already, one on other hosts, nor an attached run's directory."""
    cluster = parse(INVENTORY, str(tmp_path / "inventory.yaml"))
    other = parse(INVENTORY.replace("10.0.0.1", "10.9.9.9").replace("port: 2222", "port: 2200"),
                  str(tmp_path / "other.yaml"))
    runs = tmp_path / "runs"
    for run_id, on in (("20261207-010000-aaaaaa", cluster), ("20261207-010000-bbbbbb", cluster),
                       ("20261207-010000-cccccc", other)):
        follow.Record(run_id, "mini1", f"/w/.clusterctl/detached/{run_id}", 1, 0.0, on).write(str(runs / run_id))
    (runs / "20261207-010000-bbbbbb" / follow.HOME_MARK).write_text("{}")            # home already
    (runs / "20261207-010000-dddddd").mkdir()                                         # attached
    assert [(r.run_id, d) for r, d in follow.waiting_on(str(runs), cluster)] == \
        [("20261207-010000-aaaaaa", str(runs / "20261207-010000-aaaaaa"))]
    assert [r.run_id for r, _ in follow.waiting_on(str(runs), other)] == ["20261207-010000-cccccc"]
    assert follow.waiting_on(str(tmp_path / "none"), cluster) == []


def test_the_handoff_carries_the_whole_cluster_seen_from_the_supervising_host(tmp_path):
    cluster = parse(INVENTORY, str(tmp_path / "inventory.yaml"))
    seen = handoff.as_seen_from(cluster, "mini1")
    assert [h.identity_file for h in seen.hosts] == ["~/.ssh/clusterctl_mesh"] * 2    # the laptop's key is not there
    given = handoff.Handoff("20261206-120000-abcdef", "mini1", seen, ("--plain",), {"X": "1"}, {"mini2": {"M": "/m"}})
    path = str(tmp_path / "handoff.json")
    handoff.write(path, given)
    assert os.stat(path).st_mode & 0o777 == 0o600            # it holds the env's secret values
    back = handoff.read(path)
    assert back == given and back.cluster.hosts[0].secret_env == ("HF_TOKEN",)
    assert back.cluster.secrets == ["hf_abc"]
    served = dataclasses.replace(given, command="serve", stored={"mini1": "/s/m", "mini2": "/t/m"})
    handoff.write(path, served)
    assert handoff.read(path) == served         # a server's: its command and where each host's store holds the model
    with pytest.raises(KeyError):
        handoff.as_seen_from(cluster, "nobody")
    with pytest.raises(UsageError, match="not a detached run's handoff"):
        handoff.from_json(json.dumps({"version": 1, "run_id": "x"}))
    with pytest.raises(UsageError, match="another version"):
        handoff.from_json(json.dumps({"version": 99}))
    # an ssh_config path that is not on the supervising host is dropped there, not included
    data = json.loads(handoff.to_json(dataclasses.replace(given, cluster=dataclasses.replace(
        seen, ssh_config=str(tmp_path / "absent")))))
    assert handoff.cluster_from_dict(data["cluster"]).ssh_config is None


def run_script(name, *args, env=None, timeout=30):
    return subprocess.run([sys.executable, "-c", program(name), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_the_keeper_outlives_its_command_records_the_supervisor_and_follow_reads_it_to_its_end(tmp_path):
    folder, work = tmp_path / "detached" / "r1", tmp_path / "work"
    work.mkdir()
    (work / "lib").mkdir()
    (work / "lib" / "marker.py").write_text("print('imported from the workdir-relative PYTHONPATH')\n")
    # it runs until the test lets it end (a file appears): `state` must find it running however loaded this machine
    go = tmp_path / "go"
    supervisor = ("import marker, os, sys, time\nfor i in range(5):\n    print('line', i, flush=True); time.sleep(0.2)\n"
                  f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\nsys.exit(3)\n")
    env = {**os.environ, "PYTHONPATH": "lib"}
    began = time.monotonic()
    started = run_script("detach.py", str(folder), str(work), sys.executable, "-c", supervisor, env=env)
    assert time.monotonic() - began < 10 and started.returncode == 0, started.stderr
    pid = json.loads(started.stdout)["pid"]
    assert os.getsid(pid) != os.getsid(0)                      # a session of its own: no terminal, no SIGHUP
    state = json.loads(run_script("follow.py", str(folder), "state").stdout)
    assert state == {"state": "running", "pid": pid}
    go.touch()
    followed = run_script("follow.py", str(folder), "follow", "0")
    text, _, last = followed.stdout.rpartition("\x1eclusterctl-supervisor-state ")
    assert text.splitlines() == ["imported from the workdir-relative PYTHONPATH",
                                 *(f"line {i}" for i in range(5))]
    assert json.loads(last)["state"] == "ended" and json.loads(last)["code"] == 3
    # from an offset: only what came after it
    tail = run_script("follow.py", str(folder), "follow", str(len("imported from the workdir-relative PYTHONPATH\n")))
    assert tail.stdout.splitlines()[0] == "line 0"
    assert (folder / "supervisor.log").stat().st_mode & 0o777 == 0o600


def test_a_supervisor_killed_is_ended_by_its_signal_and_one_whose_keeper_died_too_is_lost(tmp_path):
    folder, work = tmp_path / "r2", tmp_path / "work"
    work.mkdir()
    started = run_script("detach.py", str(folder), str(work), sys.executable, "-c", "import time; time.sleep(60)")
    pid = json.loads(started.stdout)["pid"]
    stopped = json.loads(run_script("follow.py", str(folder), "stop").stdout)
    assert stopped["signalled"] is True
    deadline = time.monotonic() + 10
    while json.loads(run_script("follow.py", str(folder), "state").stdout)["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    ended = json.loads(run_script("follow.py", str(folder), "state").stdout)
    assert ended["state"] == "ended" and ended["code"] == -15
    # no exit.json and the recorded pid gone (the host restarted): lost
    (folder / "exit.json").unlink()
    assert json.loads(run_script("follow.py", str(folder), "state").stdout)["state"] == "lost"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_supervisor_gone_while_its_keeper_lives_has_ended_not_been_lost(tmp_path):
    """The keeper reaps the supervisor, then writes exit.json (with an fsync): on a loaded host `state` can come
    between the two. While the keeper lives it waits for exit.json; with the keeper gone too, the run is lost."""
    from clusterctl.hosts.scripts.proctime import start_time

    folder = tmp_path / "r4"
    folder.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()                                                  # reaped: its pid names no process now
    (folder / "supervisor.pid").write_text(f"{gone.pid} \n")
    # the keeper, slow to write: exit.json comes 1.5 s after the supervisor is gone
    late = (f"import json, os, time\ntime.sleep(1.5)\nopen({str(folder / 'exit.tmp')!r}, 'w').write("
            "json.dumps({'code': 0, 'ended': time.time()}))\n"
            f"os.replace({str(folder / 'exit.tmp')!r}, {str(folder / 'exit.json')!r})\ntime.sleep(30)\n")
    keeper = subprocess.Popen([sys.executable, "-c", late])
    try:
        (folder / "keeper.pid").write_text(f"{keeper.pid} {start_time(keeper.pid)}\n")
        assert json.loads(run_script("follow.py", str(folder), "state").stdout) == \
            {"state": "ended", "code": 0, "ended": json.loads((folder / "exit.json").read_text())["ended"]}
        # the keeper gone as well and no exit.json (the host restarted): lost, at once
        keeper.kill()
        keeper.wait()
        (folder / "exit.json").unlink()
        began = time.monotonic()
        lost = json.loads(run_script("follow.py", str(folder), "state").stdout)
        assert lost["state"] == "lost" and lost["pid"] == gone.pid and time.monotonic() - began < 5
    finally:
        keeper.kill()
        keeper.wait()


def test_the_live_panel_travels_from_the_supervisors_snapshot_file_between_lines_and_is_aged_where_it_is_drawn(
        tmp_path):
    from clusterctl.observe.live import LiveRun, Replayed, from_json, to_json
    from clusterctl.observe.telemetry import HostTelemetry, RankProcess

    live = LiveRun(["h1", "h2"], 100.0)
    live.update(0, "metrics", {"step": 10, "total_steps": 100, "loss": 2.5, "tokens_per_s": 900.0}, 101.0)
    live.update(1, "metrics", {"step": 10, "total_steps": 100, "loss": 2.5, "tokens_per_s": 800.0}, 101.0)
    live.update(0, "metrics", {"step": 20, "total_steps": 100, "loss": 2.0, "tokens_per_s": 950.0}, 106.0)
    live.update(1, "metrics", {"step": 20, "total_steps": 100, "loss": 2.0, "tokens_per_s": 850.0}, 106.0)
    live.hosts_seen((HostTelemetry("h1", taken=105.0, load_1m=1.5, ranks=(RankProcess("r", 0, 7, 1000),)),
                     HostTelemetry("h2", state="unreachable", error="timed out")), 105.0)
    snap = live.snapshot(107.0)
    doc = json.loads(json.dumps(to_json(snap, 5000.0)))            # as the file holds it
    assert from_json(doc, 5000.0) == snap                          # read at once: the very snapshot
    later = from_json(doc, 5003.0)                                  # 3 s later: elapsed and ages grown, ETA down
    assert later.job.elapsed_s == snap.job.elapsed_s + 3 and later.job.eta_s == max(0.0, snap.job.eta_s - 3)
    assert later.ranks[0].since_seen_s == snap.ranks[0].since_seen_s + 3 and later.hosts == snap.hosts
    assert from_json(doc, 9000.0).job.elapsed_s == snap.job.elapsed_s + 30     # another clock: at most 30 s
    assert Replayed().snapshot(0.0).ranks == []                    # nothing yet: an empty panel

    # on the host: the snapshot file's changes sent between the log's lines, after LIVE_MARK
    folder, work = tmp_path / "r3", tmp_path / "work"
    work.mkdir()
    supervisor = ("import json, os, sys, time\nfor i in range(3):\n    print('line', i, flush=True)\n"
                  "    tmp = '.live.json.tmp'\n    open(tmp, 'w').write(json.dumps({'n': i}))\n"
                  "    os.replace(tmp, sys.argv[1])\n    time.sleep(0.6)\n")
    run_script("detach.py", str(folder), str(work), sys.executable, "-c", supervisor, str(folder / ".live.json"))
    followed = run_script("follow.py", str(folder), "follow", "0").stdout.split("\n")     # (splitlines splits at \x1e)
    sent = [json.loads(line.split(" ", 1)[1])["n"] for line in followed if line.startswith("\x1eclusterctl-live ")]
    assert sent and sent == sorted(set(sent)) and sent[-1] == 2, followed     # each change once, in order, the last one too
    assert [line for line in followed if line.startswith("line")] == ["line 0", "line 1", "line 2"]


def test_a_supervisor_that_ended_and_waits_to_be_reaped_is_not_running():
    """proctime.start_time: a zombie (a process killed with its keeper waits for init to reap it) has ended: a
    supervisor's state must not read it as running; a live process has its start time."""
    from clusterctl.hosts.scripts.proctime import start_time

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    ended = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while open(f"/proc/{ended.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert start_time(ended.pid) is None and start_time(live.pid)
    finally:
        live.kill()
        live.wait()
        ended.wait()
