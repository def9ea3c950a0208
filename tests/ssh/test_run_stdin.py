"""`run` gives every rank its own stdin, the same bytes to each, then EOF (docs/run.md#standard-input), on two
real test hosts: over ring (the rank starter) and mpi (the stdin relay), launched here and from the first host;
`--no-stdin` gives EOF at once; `mlx_lm chat` answers a piped prompt as under mlx.launch."""
import hashlib
import os
import shutil
import signal
import threading
import subprocess
import time
from functools import partial

import clirun
import pytest
from test_run import assert_nothing_left, job_processes

pytestmark = pytest.mark.ssh
run = partial(clirun.clusterctl, "run", timeout=240, own_cache=True)

READ = """\
import hashlib, os, sys
data = sys.stdin.buffer.read()
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["MLX_RANK"]
shown = data.hex() if len(data) < 100 else f"{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}"
print(f"rank {rank} read {shown} then EOF", flush=True)
"""
DATA = b"Tom found\nq\n  \\ $(x) \xff tail"
# 1 MB of random bytes, NULs among them, then text that printf's %b would read as escapes, and no last newline
BINARY = os.urandom(2**20) + b"\0\\c %s \\0101\n\0\\"


@pytest.mark.parametrize("backend, where", [("ring", "here"), ("mpi", "here"), ("ring", "first-host"),
                                            ("mpi", "first-host")])
def test_every_rank_reads_the_same_bytes_then_eof(make_cluster, tmp_path, backend, where):
    """Text, and (here) binary data byte for byte: NUL bytes included."""
    cluster = make_cluster(2)
    (tmp_path / "read.py").write_text(READ)
    runs = [(DATA, DATA.hex())] + ([(BINARY, f"{len(BINARY)} bytes, sha256 {hashlib.sha256(BINARY).hexdigest()}")]
                                   if where == "here" else [])
    for data, shown in runs:
        r = subprocess.run([*clirun.COMMAND, "run", "--hosts", str(cluster.inventory), "--backend", backend, "--plain",
                            "--launch-from", where, "read.py"], input=data, capture_output=True, timeout=240,
                           cwd=tmp_path, env=clirun.cache_env(tmp_path))
        out, err = r.stdout.decode(), r.stderr.decode()
        assert r.returncode == 0, out + err
        lines = sorted(line for line in out.splitlines() if " read " in line)
        assert lines == [f"[rank {k} h{k + 1}] rank {k} read {shown} then EOF" for k in range(2)], out + err
        assert_nothing_left(cluster, clirun.TOKEN.search(err).group(1))


RESTART = """\
import os, sys
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["MLX_RANK"]
attempt = os.environ["CLUSTERCTL_RESTART"]
print(f"attempt {attempt} rank {rank} started", flush=True)
for n, line in enumerate(sys.stdin.buffer, 1):
    print(f"attempt {attempt} rank {rank} got {line.hex()}", flush=True)
    if (attempt, rank, n) == ("0", "1", 5):
        sys.exit(1)
print(f"attempt {attempt} rank {rank} EOF", flush=True)
"""


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_a_restart_reads_on_where_the_attempt_before_stopped(make_cluster, tmp_path, backend):
    """Numbered lines written while the job runs: rank 1 fails after 5 lines, and the next attempt's ranks each
    read a contiguous run of whole lines to the last one, then EOF. (The first attempt's copy used to go on
    reading beside the next one's: lines lost and two merged.)"""
    cluster = make_cluster(2)
    (tmp_path / "restart.py").write_text(RESTART)
    lines = [b"line %03d\n" % i for i in range(120)]
    job = subprocess.Popen([*clirun.COMMAND, "run", "--hosts", str(cluster.inventory), "--backend", backend, "--plain",
                            "--max-restarts", "1", "--restart-delay", "0", "restart.py"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path, env=clirun.cache_env(tmp_path))
    seen: list[str] = []
    restarted = threading.Event()

    def read():
        for raw in job.stdout:
            seen.append(raw.decode(errors="replace"))
            if "attempt 1 rank 1 started" in seen[-1]:
                restarted.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    for i, line in enumerate(lines):
        if i == 60:        # the rest only once the next attempt runs: it must get them live, not all at once
            assert restarted.wait(120), "".join(seen)
        job.stdin.write(line)
        job.stdin.flush()
        time.sleep(0.02)
    job.stdin.close()
    assert job.wait(timeout=120) == 0, "".join(seen)
    reader.join(10)
    out = "".join(seen)
    for rank in (0, 1):
        got = [bytes.fromhex(line.rsplit(" got ", 1)[1]) for line in out.splitlines()
               if f"attempt 1 rank {rank} got " in line]
        assert got and got[-1] == lines[-1], out
        first = lines.index(got[0])       # a whole line of ours, not a piece of one or two merged
        assert got == lines[first:], out
        assert first <= 60, out           # every line written once it ran reached it
        assert f"attempt 1 rank {rank} EOF" in out
    assert "attempt 0 rank 1 got " + lines[4].hex() in out
    assert_nothing_left(cluster, clirun.TOKEN.search(out).group(1))


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_no_stdin_gives_every_rank_eof_at_once(make_cluster, tmp_path, backend):
    cluster = make_cluster(2)
    (tmp_path / "read.py").write_text(READ)
    r = run("--hosts", str(cluster.inventory), "--backend", backend, "--plain", "--no-stdin", "read.py",
            input="never read", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(line for line in r.stdout.splitlines() if " read " in line) == [
        f"[rank {k} h{k + 1}] rank {k} read  then EOF" for k in range(2)]


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_mlx_lm_chat_answers_a_piped_prompt_on_two_hosts(make_cluster, tmp_path, backend):
    pytest.importorskip("mlx_lm")
    import lmfixture

    cluster = make_cluster(2)
    made = lmfixture.make_inputs(tmp_path / "made")
    shutil.copytree(made["llama"], tmp_path / "project" / "models" / "llama")
    r = run("--hosts", str(cluster.inventory), "--backend", backend, "--plain", "-m", "mlx_lm", "chat",
            "--model", "models/llama", "--max-tokens", "5", input="Tom found\nq\n", cwd=tmp_path / "project")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "EOFError" not in r.stdout + r.stderr
    # rank 0's reply to the prompt (its 5 tokens and their count), then the `q` that ended the chat
    rank0 = [line for line in r.stdout.splitlines() if line.startswith("[rank 0 h1]")]
    assert any("5 tokens" in line for line in rank0) and rank0[-1].endswith(" bye"), r.stdout[-3000:]
    assert_nothing_left(cluster, clirun.TOKEN.search(r.stderr).group(1))


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_sigkill_of_clusterctl_after_the_data_ended_still_stops_every_rank(make_cluster, tmp_path, backend):
    """The data's end is a frame, not the channel's: the watchdogs still see clusterctl go, even by SIGKILL."""
    cluster = make_cluster(2)
    (tmp_path / "wait.py").write_text("import sys, time\nprint('read', repr(sys.stdin.read()), flush=True)\n"
                                      "time.sleep(300)\n")
    job = subprocess.Popen([*clirun.COMMAND, "run", "--hosts", str(cluster.inventory), "--backend", backend,
                            "--plain", "wait.py"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=clirun.cache_env(tmp_path))
    job.stdin.write("x\n")
    job.stdin.close()
    seen, deadline = [], time.monotonic() + 120
    while sum("read 'x\\n'" in line for line in seen) < 2 and time.monotonic() < deadline:
        line = job.stdout.readline()
        if not line:
            break
        seen.append(line)
    assert sum("read 'x\\n'" in line for line in seen) == 2, "".join(seen)
    run_id = clirun.TOKEN.search("".join(seen)).group(1)
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=30)
    deadline = time.monotonic() + 30         # the watchdogs' TERM, then their KILL after the grace period
    while job_processes(run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert_nothing_left(cluster, run_id)
