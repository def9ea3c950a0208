"""Running the clusterctl command line from tests as a user runs it: `python -m clusterctl ARGS` in a child
process, so the real entry point, exit code, stdout and stderr are what a test sees.

Every test file uses these (bound with its own defaults through functools.partial where it needs them), so
how the CLI is started is decided in one place.
"""
import os
import re
import subprocess
import sys

COMMAND = (sys.executable, "-m", "clusterctl")
# the run id in `run`'s lines ("run 20261125-205307-1c97f5: ..."): TOKEN.search(r.stderr).group(1)
TOKEN = re.compile(r"run (\d{8}-\d{6}-[0-9a-f]{6})")


def paced(step_s: float) -> list[str]:
    """`run`'s arguments that make every step of the bundled trainer last at least step_s seconds (its test aid
    CLUSTERCTL_TRAIN_STEP_S, docs/trainer.md#test-aids: the rank sleeps the rest; nothing it computes changes); none
    for 0. A test that acts on a run's line before the run's next checkpoint or end paces the run, since its steps
    can come faster than a loaded machine's test reads them."""
    return ["--env", f"CLUSTERCTL_TRAIN_STEP_S={step_s:g}"] if step_s else []


def cache_env(cwd, env: dict | None = None) -> dict:
    """`env` (default: this process's) with clusterctl's cache (plans, the runs index) under `cwd`/.cache, so
    that a test neither reads nor leaves anything in the user's ~/.cache."""
    return {**(os.environ if env is None else env), "XDG_CACHE_HOME": os.path.join(str(cwd), ".cache")}


def clusterctl(*args: str, cwd=None, timeout: float = 120, env: dict | None = None, own_cache: bool = False,
               **kwargs) -> subprocess.CompletedProcess:
    """Run `clusterctl ARGS` to the end; own_cache: with cache_env(cwd). Its stdin is empty unless `input` (or
    `stdin`) says otherwise: `run` gives every rank its stdin, never the test runner's."""
    if own_cache:
        env = cache_env(cwd, env)
    if "input" not in kwargs:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env,
                          **kwargs)


def start(*args: str, cwd=None, env: dict | None = None, own_cache: bool = False) -> subprocess.Popen:
    """Start `clusterctl ARGS` in the background, its stderr merged into its stdout (a pipe, read as text)."""
    if own_cache:
        env = cache_env(cwd, env)
    return subprocess.Popen([*COMMAND, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env)
