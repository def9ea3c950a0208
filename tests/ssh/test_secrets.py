"""An inventory env value is a secret (docs/security.md#where-secrets-go), on the real loopback cluster.

During a whole `run` over ring (clusterctl's rank starter) and over mpi (real mpirun), launched from this
machine and from the first host, a sampler reads every process's command line on this machine (every
simulated host lives here, so that is every host's `ps`) twenty times a second: the value of HF_TOKEN never
appears in one, while every rank finds it in its environment. Afterwards no file under runs/ or the cache that
holds it can be read by another user.
"""
import hashlib
import os
import secrets
import stat
import threading
import time

import pytest
from test_run import run

pytestmark = pytest.mark.ssh

PROGRAM = """
import hashlib, os, sys, time
import mlx.core as mx
g = mx.distributed.init()
token = os.environ.get("HF_TOKEN", "")
ok = hashlib.sha256(token.encode()).hexdigest() == sys.argv[1]
x = mx.distributed.all_sum(mx.ones(1), group=g)
mx.eval(x)
print(f"rank {g.rank()} of {g.size()} token {'ok' if ok else 'WRONG'} sum {x.item():g} plain "
      f"{os.environ.get('PLAIN')}", flush=True)
time.sleep(3)      # the ranks stay up while the sampler looks
"""


class ArgvSampler(threading.Thread):
    """Every process's argv on this machine, read from /proc until stopped; keeps those holding `needle`."""

    def __init__(self, needle: str):
        super().__init__(daemon=True)
        self.needle, self.found, self.samples, self.done = needle.encode(), {}, 0, threading.Event()

    def run(self):
        while not self.done.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = f.read()
                except OSError:
                    continue
                if self.needle in argv:
                    self.found[pid] = argv.replace(b"\0", b" ").decode(errors="replace")[:300]
            self.samples += 1
            time.sleep(0.05)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join()


def readable_by_others(root: str, needle: str) -> list[str]:
    """Files under `root` holding `needle` that a user other than their owner can read."""
    leaks = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    if needle.encode() not in f.read():
                        continue
            except OSError:
                continue
            if os.stat(path).st_mode & (stat.S_IRGRP | stat.S_IROTH):
                leaks.append(path)
    return leaks


# Every backend from both places, the secret from the inventory or from `run --env HF_TOKEN --env PLAIN=x` (issue
# 42: --env's values join the inventory's env before anything else reads it, Cluster.with_env, so they travel the
# same way; each launch path is covered by one of the two)
@pytest.mark.parametrize("backend, launch_from, given", [
    ("ring", "here", "inventory"), ("mpi", "first-host", "inventory"),
    ("ring", "first-host", "--env"), ("mpi", "here", "--env")])
def test_an_inventory_secret_never_appears_on_a_command_line(make_cluster, tmp_path, backend, launch_from, given):
    secret = "hf_" + secrets.token_hex(12)
    cluster = make_cluster(2)
    if given == "inventory":
        inventory, env, words = cluster.write_inventory(env={"HF_TOKEN": secret, "PLAIN": "x"}), None, []
    else:         # the secret from this machine's environment, by name; the inventory's own PLAIN overridden
        inventory = cluster.write_inventory(env={"PLAIN": "from the inventory"})
        env, words = {**os.environ, "HF_TOKEN": secret}, ["--env", "HF_TOKEN", "--env", "PLAIN=x"]
    (tmp_path / "prog.py").write_text(PROGRAM)
    digest = hashlib.sha256(secret.encode()).hexdigest()
    where = ["--launch-from", launch_from]
    with ArgvSampler(secret) as sampler:
        r = run("--hosts", str(inventory), "--backend", backend, *where, *words, "--plain", "prog.py", digest,
                cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(line.split(" sum")[0].split("] ")[-1] for line in r.stdout.splitlines() if " token " in line) == [
        "rank 0 of 2 token ok", "rank 1 of 2 token ok"], r.stdout
    assert sorted(line.split(" plain ")[-1] for line in r.stdout.splitlines() if " token " in line) == ["x", "x"]
    assert sampler.samples > 20 and sampler.found == {}, sampler.found
    assert secret not in r.stdout + r.stderr
    for root in (tmp_path / "runs", tmp_path / ".cache"):
        assert root.is_dir() or root.name == ".cache"
        assert readable_by_others(str(root), secret) == []
    [record] = (tmp_path / "runs").glob("*/launch.json")
    assert secret not in record.read_text() and "<redacted>" in record.read_text()


def test_the_dry_run_redacts_and_mlx_launch_is_warned_of(make_cluster, tmp_path):
    secret = "hf_" + secrets.token_hex(12)
    cluster = make_cluster(2)
    inventory = cluster.write_inventory(env={"HF_TOKEN": secret})
    (tmp_path / "prog.py").write_text("print(1)\n")
    for launcher in ("clusterctl", "mlx.launch"):
        r = run("--hosts", str(inventory), "--backend", "ring", "--launcher", launcher, "--dry-run", "prog.py",
                cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert secret not in r.stdout + r.stderr and '"HF_TOKEN": "<redacted>"' in r.stdout
        warned = "warning: mlx.launch takes the ranks' environment on its command line" in r.stderr
        assert warned == (launcher == "mlx.launch"), r.stderr
