"""`run` gives every rank its own stdin, the same bytes to each, then EOF (docs/run.md#standard-input), on two
real test hosts: over ring (the rank starter) and mpi (the stdin relay), launched here and from the first host;
`--no-stdin` gives EOF at once; `mlx_lm chat` answers a piped prompt as under mlx.launch."""
import shutil
import signal
import subprocess
import time
from functools import partial

import clirun
import pytest
from test_run import assert_nothing_left, job_processes

pytestmark = pytest.mark.ssh
run = partial(clirun.clusterctl, "run", timeout=240, own_cache=True)

READ = """\
import os, sys
data = sys.stdin.buffer.read()
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["MLX_RANK"]
print(f"rank {rank} read {data.hex()} then EOF", flush=True)
"""
DATA = b"Tom found\nq\n  \\ $(x) \xff tail"


@pytest.mark.parametrize("backend, where", [("ring", "here"), ("mpi", "here"), ("ring", "first-host"),
                                            ("mpi", "first-host")])
def test_every_rank_reads_the_same_bytes_then_eof(make_cluster, tmp_path, backend, where):
    cluster = make_cluster(2)
    (tmp_path / "read.py").write_text(READ)
    r = subprocess.run([*clirun.COMMAND, "run", "--hosts", str(cluster.inventory), "--backend", backend, "--plain",
                        "--launch-from", where, "read.py"], input=DATA, capture_output=True, timeout=240,
                       cwd=tmp_path, env=clirun.cache_env(tmp_path))
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, out + err
    lines = sorted(line for line in out.splitlines() if " read " in line)
    assert lines == [f"[rank {k} h{k + 1}] rank {k} read {DATA.hex()} then EOF" for k in range(2)], out + err
    assert_nothing_left(cluster, clirun.TOKEN.search(err).group(1))


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
