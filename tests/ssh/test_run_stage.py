"""What `clusterctl run` copies to the hosts before it launches: the project (the current directory) and,
for a clusterctl module such as the bundled trainer, clusterctl itself."""
import os
import re
import shutil

import clirun
import pytest
from sshcluster import requires_private_roots

pytestmark = pytest.mark.ssh


def run(*args, cwd):
    env = {**os.environ, "XDG_CACHE_HOME": os.path.join(os.path.dirname(cwd), ".cache")}   # not in the project
    return clirun.clusterctl("run", *args, timeout=180, cwd=cwd, env=env)


def test_run_copies_the_project_to_every_host_first(make_cluster, tmp_path):
    cluster = make_cluster(2)
    requires_private_roots(cluster, "each host needs its own working root")
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "helper.py").write_text("VALUE = 42\n")
    (project / "main.py").write_text("import socket\nfrom pkg.helper import VALUE\nprint('value', VALUE)\n")
    (project / ".gitignore").write_text("secret.txt\n")
    (project / "secret.txt").write_text("not for the hosts\n")
    r = run("main.py", "--hosts", str(cluster.inventory), cwd=project)
    assert r.returncode == 0, r.stderr
    assert "sync: project to 2 host(s): 8 file(s)" in r.stderr    # main.py, pkg/*, .gitignore: 4 each
    assert sorted(l for l in r.stdout.splitlines() if "value" in l) == \
        ["[rank 0 h1] value 42", "[rank 1 h2] value 42"]
    for i in (1, 2):                                  # each host's own private workdir holds the tree
        assert cluster.ssh(i, f"cat {cluster.workdir}/pkg/helper.py").stdout == "VALUE = 42\n"
        assert cluster.ssh(i, f"test -e {cluster.workdir}/secret.txt").returncode == 1
    r = run("main.py", "--hosts", str(cluster.inventory), cwd=project)
    assert r.returncode == 0 and "project to 2 host(s): 0 file(s)" in r.stderr, r.stderr   # nothing changed
    (project / "main.py").unlink()
    r = run("main.py", "--hosts", str(cluster.inventory), "--no-sync", cwd=project)
    assert r.returncode == 0 and "sync:" not in r.stderr                 # the hosts' copy, untouched


def test_a_warm_run_copies_beside_its_launch_and_every_rank_runs_the_new_copy(make_cluster, tmp_path):
    """With the plan cached, run starts the project's copy with the launcher, not before it; each rank waits
    for its host's copy to end before its program runs (docs/run.md#the-project-copy): a file changed since the
    last run is what every rank reads, even one rsync sends after 16 MB that changed too."""
    cluster = make_cluster(2)
    requires_private_roots(cluster, "each host needs its own working root")
    project = tmp_path / "project"
    project.mkdir()
    (project / "job.py").write_text("print('version', open('z_version.txt').read(), len(open('a_big.bin', 'rb').read()))\n")
    (project / "z_version.txt").write_text("old")
    (project / "a_big.bin").write_bytes(os.urandom(1 << 20))
    r = run("job.py", "--hosts", str(cluster.inventory), cwd=project)      # the first: copy, then launch
    assert r.returncode == 0 and r.stdout.count("version old 1048576") == 2, r.stdout + r.stderr
    (project / "a_big.bin").write_bytes(os.urandom(16 << 20))
    (project / "z_version.txt").write_text("newer")
    r = run("job.py", "--hosts", str(cluster.inventory), cwd=project)      # warm: beside the launch
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(l for l in r.stdout.splitlines() if "version" in l) == \
        ["[rank 0 h1] version newer 16777216", "[rank 1 h2] version newer 16777216"]
    assert "sync: project to 2 host(s): 4 file(s)" in r.stderr
    for i in (1, 2):      # the copy's mark, for the ranks that waited on it
        marks = cluster.ssh(i, f"ls {cluster.workdir}/.clusterctl/copies").stdout.split()
        assert len(marks) == 1 and re.fullmatch(r"[0-9a-f]{16}", marks[0])


def test_a_copy_beside_the_launch_that_fails_stops_the_job_before_its_program_runs(make_cluster, tmp_path):
    """A warm run whose copy to one host fails: the job is stopped, its error is the copy's, in one line, and
    that host's rank never ran its program; nothing of the run is left on any host."""
    cluster = make_cluster(2)
    requires_private_roots(cluster, "each host needs its own working root")
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text("print('program-started')\n")
    r = run("main.py", "--hosts", str(cluster.inventory), cwd=project)
    assert r.returncode == 0 and r.stdout.count("program-started") == 2, r.stdout + r.stderr
    (project / "conf").write_text("x = 1\n")
    # a folder that is not empty where the file must go: rsync does not delete it (--force is not ours to give)
    assert cluster.ssh(2, f"mkdir -p {cluster.workdir}/conf/own && : > {cluster.workdir}/conf/own/f").returncode == 0
    r = run("main.py", "--hosts", str(cluster.inventory), cwd=project)
    assert r.returncode == 1, r.stdout + r.stderr
    # the line names the cause rsync gave, not its "some files/attrs were not transferred (see previous errors)"
    assert re.search(r"could not copy the project .*h2: rsync exited 23: .*(non-empty directory|make way).*: conf",
                     r.stderr) and "Traceback" not in r.stderr, r.stderr
    # no rank ran its program on a copy that failed (h1's copy was whole: its rank may have started)
    assert "[rank 1 h2] program-started" not in r.stdout
    run_id = re.search(r"run (\d{8}-\d{6}-[0-9a-f]{6})", r.stderr).group(1)
    for i in (1, 2):
        ps = cluster.ssh(i, "ps -eo args")
        assert ps.returncode == 0 and f"clusterctl-run-{run_id}" not in ps.stdout


def test_a_clusterctl_module_runs_on_hosts_without_clusterctl(make_cluster, tmp_path):
    """The hosts' python has no clusterctl installed (Debian's own python3): run ships the running
    clusterctl into <workdir>/.clusterctl/lib and the ranks import it from there."""
    cluster = make_cluster(2)
    requires_private_roots(cluster, "each host needs its own working root")
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no system python3")
    inventory = cluster.write_inventory(python="/usr/bin/python3")
    assert cluster.ssh(1, "cd / && /usr/bin/python3 -c 'import clusterctl'").returncode != 0
    project = tmp_path / "project"
    project.mkdir()
    r = run("-m", "clusterctl.launch.bootstrap", "--hosts", str(inventory), "--backend", "mpi", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sync: clusterctl to 2 host(s)" in r.stderr
    for i in (1, 2):
        assert cluster.ssh(i, f"test -f {cluster.workdir}/.clusterctl/lib/clusterctl/train/fsdp.py").returncode == 0
    r = run("-m", "clusterctl.launch.bootstrap", "--hosts", str(inventory), "--backend", "mpi", "--no-sync", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr                        # still there from the first run


TINY = ["--n-layers", "1", "--dim", "32", "--mlp-dim", "64", "--n-heads", "2", "--block-size", "32",
        "--batch-size", "4", "--steps", "6", "--report-every", "3", "--eval-every", "6", "--ckpt-every", "6"]


def test_the_bundled_trainer_on_the_cluster_reads_each_hosts_own_shard(make_cluster, tmp_path):
    """`run --data DIR` without a script: host i receives only shard i, the bundled trainer trains on it,
    and rank 0's host keeps the run's metrics and checkpoints in <workdir>/runs/<id>/."""
    cluster = make_cluster(2)
    requires_private_roots(cluster, "each host needs its own working root")
    data = tmp_path / "tiny"
    prep = clirun.clusterctl("data", "prepare", "embedded:300", "--world", "2", "--out", str(data), timeout=120)
    assert prep.returncode == 0, prep.stderr
    project = tmp_path / "project"
    project.mkdir()
    r = run("--hosts", str(cluster.inventory), "--data", str(data), "--", *TINY, cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[rank 0 h1] dp on 2 rank(s)" in r.stdout and "[rank 0 h1] step 6/6" in r.stdout
    for i in (1, 2):     # only its own shard (and what every rank needs) is on each host
        ls = cluster.ssh(i, f"ls {cluster.workdir}/data/tiny").stdout.split()
        assert ls == sorted([f"shard-0000{i - 1}-of-00002.bin", "val.bin", "manifest.json"]), ls
    run_id = re.search(r"run (\d{8}-\d{6}-[0-9a-f]{6})", r.stderr).group(1)
    metrics = cluster.ssh(1, f"cat {cluster.workdir}/runs/{run_id}/metrics.jsonl")
    assert metrics.returncode == 0 and '"step": 6' in metrics.stdout
    assert cluster.ssh(1, f"test -f {cluster.workdir}/runs/{run_id}/checkpoints/step-000006/model.safetensors"
                       ).returncode == 0
    # and run brought them home: the local run directory has the metrics and a checkpoint generate can use
    local = project / "runs" / run_id
    assert "copied" in r.stderr and (local / "metrics.jsonl").read_text() == metrics.stdout
    assert (local / "rank-0.log").is_file() and (local / "checkpoints" / "step-000006" / "model.safetensors").is_file()
    g = clirun.clusterctl("generate", "--checkpoint", str(local), "--prompt", "Once", "--max-tokens", "8", timeout=120)
    assert g.returncode == 0 and g.stdout.startswith("Once"), g.stderr


def test_a_long_copy_and_a_long_fetch_tell_each_hosts_progress_every_few_seconds(make_cluster, tmp_path):
    """Issue 41: run's project copy and its --fetch, slowed to 1 MiB/s (an rsync here that adds --bwlimit: run has no
    knob for it), say each host's bytes, rate and time left in a plain line every 5 s when not on a terminal, and
    one line as each host's copy ends; a quick copy of the same project (nothing changed) says nothing."""
    cluster = make_cluster(2)
    requires_private_roots(cluster, "each host needs its own working root")
    rsync = shutil.which("rsync")
    if rsync is None:
        pytest.skip("no rsync here")
    slow = tmp_path / "slow-bin"
    slow.mkdir()
    (slow / "rsync").write_text(f'#!/bin/sh\n[ "$1" = --version ] && exec {rsync} "$@"\nexec {rsync} --bwlimit=1024 "$@"\n')
    (slow / "rsync").chmod(0o755)
    project = tmp_path / "project"
    project.mkdir()
    (project / "weights.bin").write_bytes(os.urandom(7 << 20))
    (project / "job.py").write_text("import os, shutil\nif os.environ.get('MLX_RANK', os.environ.get('OMPI_COMM_WORLD_RANK'))"
                                    " == '0':\n    shutil.copy('weights.bin', 'out.bin')\nprint('done', flush=True)\n")
    (project / ".gitignore").write_text("out.bin\nruns/\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / ".cache"), "PATH": f"{slow}:{os.environ['PATH']}"}
    r = clirun.clusterctl("run", "--hosts", str(cluster.inventory), "--fetch", "out.bin", "job.py", timeout=180,
                          cwd=project, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    for what in ("project", "fetch"):
        hosts = ("h1", "h2") if what == "project" else ("h1",)
        for host in hosts:
            assert re.search(rf"^{what}: {host}: [\d.]+ MiB of 7.0 MiB \(\d+%\), [\d.]+ [KM]iB/s, \d+ s left$", r.stderr,
                             re.M), r.stderr
            assert re.search(rf"^{what}: {host}: 7.0 MiB copied, [\d.]+ [KM]iB/s$", r.stderr, re.M), r.stderr
    assert (project / "out.bin").read_bytes() == (project / "weights.bin").read_bytes()
    r = clirun.clusterctl("run", "--hosts", str(cluster.inventory), "job.py", timeout=180, cwd=project, env=env)
    assert r.returncode == 0 and "sync: project to 2 host(s): 0 file(s)" in r.stderr, r.stderr
    assert not re.search(r"^(project|fetch): ", r.stderr, re.M), r.stderr
