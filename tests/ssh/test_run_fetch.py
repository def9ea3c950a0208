"""`clusterctl run --fetch PATH`: what a job wrote in its host's workdir (outside runs/<id>/) comes home
after the job, from rank 0's host or with --fetch-all-ranks from every host, incrementally, whatever the
job's outcome. clusterctl's options come before the script; the script's own arguments after it."""
import os
import re

import clirun
import pytest
from sshcluster import requires_private_roots

pytestmark = pytest.mark.ssh

# Every rank writes outdir/a.txt in its host's workdir (its working directory); rank 0 also
# outdir/sub/b.bin. A file is only rewritten when its content changes, so a second run of the same job
# changes nothing. argv[1]: rank 1's exit code (after a second, so rank 0 has written its files).
JOB = """import os, sys, time
rank = int(os.environ.get("MLX_RANK") or os.environ["OMPI_COMM_WORLD_RANK"])
def write(path, data):
    if os.path.exists(path) and open(path, "rb").read() == data:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").write(data)
write("outdir/a.txt", f"rank {rank}\\n".encode())
if rank == 0:
    write("outdir/sub/b.bin", bytes(range(256)) * 4)
print("wrote", rank, flush=True)
if rank == 1 and sys.argv[1] != "0":
    time.sleep(1)
    sys.exit(int(sys.argv[1]))
"""
RUN_ID = re.compile(r"run (\d{8}-\d{6}-[0-9a-f]{6})")


def run(*args, cwd):
    env = {**os.environ, "XDG_CACHE_HOME": os.path.join(os.path.dirname(cwd), ".cache")}   # not in the project
    return clirun.clusterctl("run", *args, timeout=180, cwd=cwd, env=env)


def project(tmp_path):
    p = tmp_path / "project"
    p.mkdir()
    (p / "job.py").write_text(JOB)
    (p / ".gitignore").write_text("outdir/\n")      # outputs, not sources: the next sync leaves them here
    return p


def fetched_line(stderr, what):
    m = re.search(rf"fetched {re.escape(what)} \((\d+) file\(s\), ([^)]*)\) from (\S+) into (\S+)", stderr)
    assert m, stderr
    return int(m.group(1)), m.group(2), m.group(3), m.group(4)


def test_fetch_brings_rank0s_outputs_home_incrementally(make_cluster, tmp_path):
    cluster = make_cluster(2)
    requires_private_roots(cluster, "each host needs its own working root")
    p = project(tmp_path)
    inv = str(cluster.inventory)
    # a path leaving the workdir is refused before anything starts: nothing synced, no run directory
    r = run("--hosts", inv, "--fetch", "outdir", "--fetch", "../elsewhere", "job.py", "0", cwd=p)
    assert r.returncode == 2 and "--fetch '../elsewhere' leaves the workdir" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (p / "runs").exists()
    assert cluster.ssh(1, f"test -e {cluster.workdir}/job.py").returncode == 1

    r = run("--hosts", inv, "--fetch", "outdir", "job.py", "0", cwd=p)
    assert r.returncode == 0, r.stderr
    assert fetched_line(r.stderr, "outdir/") == (2, "1.0 KiB", "h1", "./outdir")     # 7 + 1024 bytes
    assert (p / "outdir" / "a.txt").read_text() == "rank 0\n"
    assert (p / "outdir" / "sub" / "b.bin").read_bytes() == bytes(range(256)) * 4
    run_id = RUN_ID.search(r.stderr).group(1)
    assert f"logs and metrics in ./runs/{run_id}/" in r.stderr

    # the same job again: nothing changed on h1, nothing moves; a path the job never wrote is a warning
    r = run("--hosts", inv, "--fetch", "outdir", "--fetch", "nothere", "job.py", "0", cwd=p)
    assert r.returncode == 0, r.stderr
    assert fetched_line(r.stderr, "outdir/") == (0, "0 B", "h1", "./outdir")
    assert f"--fetch nothere: h1 has no {cluster.workdir}/nothere; nothing copied" in r.stderr
    # an absolute path on the host lands in runs/<id>/fetched/<name>
    r = run("--hosts", inv, "--fetch", f"{cluster.workdir}/outdir/sub/b.bin", "job.py", "0", cwd=p)
    assert r.returncode == 0, r.stderr
    run_id = RUN_ID.search(r.stderr).group(1)
    assert fetched_line(r.stderr, f"{cluster.workdir}/outdir/sub/b.bin")[:3] == (1, "1.0 KiB", "h1")
    assert (p / "runs" / run_id / "fetched" / "b.bin").read_bytes() == bytes(range(256)) * 4


def test_a_failed_job_still_fetches_and_keeps_its_exit_code(make_cluster, tmp_path):
    cluster = make_cluster(2)
    requires_private_roots(cluster, "each host needs its own working root")
    p = project(tmp_path)
    r = run("--hosts", str(cluster.inventory), "--fetch", "outdir", "job.py", "3", cwd=p)
    assert r.returncode == 3, r.stderr
    assert fetched_line(r.stderr, "outdir/")[:3] == (2, "1.0 KiB", "h1")
    assert (p / "outdir" / "a.txt").read_text() == "rank 0\n"


def test_fetch_all_ranks_brings_every_hosts_copy_into_the_run_directory(make_cluster, tmp_path):
    """h2 without rsync: its copy comes over SFTP, h1's over rsync, side by side."""
    cluster = make_cluster(2)
    requires_private_roots(cluster, "each host needs its own working root, and a PATH without rsync")
    cluster.set_session_path(2, cluster.path_without("rsync"))
    p = project(tmp_path)
    args = ("--hosts", str(cluster.inventory), "--fetch", "outdir", "--fetch-all-ranks", "job.py", "0")
    r = run(*args, cwd=p)
    assert r.returncode == 0, r.stderr
    run_id = RUN_ID.search(r.stderr).group(1)
    runs = p / "runs" / run_id
    assert fetched_line(r.stderr, "outdir/") == (2, "1.0 KiB", "h1", f"./runs/{run_id}/host-h1/outdir")
    assert (runs / "host-h1" / "outdir" / "a.txt").read_text() == "rank 0\n"
    assert (runs / "host-h1" / "outdir" / "sub" / "b.bin").read_bytes() == bytes(range(256)) * 4
    assert f"fetched outdir/ (1 file(s), 7 B, over SFTP) from h2 into ./runs/{run_id}/host-h2/outdir" in r.stderr
    assert sorted(os.listdir(runs / "host-h2" / "outdir")) == ["a.txt"]
    assert (runs / "host-h2" / "outdir" / "a.txt").read_text() == "rank 1\n"
    assert not (p / "outdir").exists()                 # per-host copies only
    # every run has its own run directory: a second run fetches everything again, into its own
    r = run(*args, cwd=p)
    assert r.returncode == 0 and "(1 file(s), 7 B, over SFTP) from h2" in r.stderr, r.stderr
