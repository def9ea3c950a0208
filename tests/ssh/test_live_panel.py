"""run's live panel in a real terminal: a 2-host job of the bundled trainer under tmux, its pane captured at
two moments and after a resize. Both ranks' rows show advancing steps, and the `[rank 0 h1] step ...`
lines scrolling above the panel are whole."""
import os
import re
import shlex
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.ssh

ROW = re.compile(r"^\s*(\d+)\s+(h\d)\s+(starting|running|finished|failed)\s+(\d+)/(\d+)\s+[\d.]+\s+[\d,]+\s+"
                 r"(?:\d+%\s+)?[\d,.]+ MB\s+[\d.]+s ago\s+[\d.]+\s*$")      # share: the trainer's balancing
STEP_LINE = re.compile(r"^\[rank 0 h1\] step +\d+/3000 \| loss [\d.]+ \| lr [\d.e+-]+ \| [\d,]+ tok/s \| "
                       r"peak mem [\d,.]+ MB \| grad norm [\d.]+$")
JOB = re.compile(r"^job: elapsed \d+:\d\d  step \d+/3000  ETA (\d+:\d\d|-)  [\d,]+ tok/s$")


class Tmux:
    """A tmux server of the test's own (-L), so the user's sessions are never touched."""

    def __init__(self, name, session="panel"):
        self.base, self.session = ["tmux", "-L", name], session
        self.socket = os.path.join(os.environ.get("TMUX_TMPDIR", "/tmp"), f"tmux-{os.getuid()}", name)

    def close(self):
        self("kill-server")
        if os.path.exists(self.socket):       # the server leaves its socket file behind
            os.unlink(self.socket)

    def __call__(self, *args):
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=10)

    def pane(self):
        # -J joins lines the terminal wrapped, so a line is checked whole whatever the width
        return self("capture-pane", "-p", "-J", "-S", "-200", "-t", self.session).stdout.splitlines()


def rows(lines):
    """rank -> step, from the last panel on screen."""
    found = {}
    for line in lines:
        m = ROW.match(line)
        if m:
            found[int(m.group(1))] = (m.group(2), int(m.group(4)))
    return found


def wait_for(tmux, ok, timeout):
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        lines = tmux.pane()
        if ok(lines):
            return lines
        time.sleep(0.5)
    raise AssertionError("\n".join(lines))


def test_the_panel_shows_both_ranks_advancing_under_whole_rank_lines(make_cluster, tmp_path):
    cluster = make_cluster(2)
    env = {"XDG_CACHE_HOME": str(tmp_path / ".cache"), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    command = (f"cd {shlex.quote(str(tmp_path))} && env {' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())} "
               f"{shlex.quote(sys.executable)} -m clusterctl run --hosts {shlex.quote(str(cluster.inventory))} "
               "-- --steps 3000 --report-every 5 --eval-every 0 --ckpt-every 0; echo EXIT=$?; sleep 600")
    tmux = Tmux(f"clusterctl-test-{os.getpid()}")
    try:
        assert tmux("new-session", "-d", "-s", "panel", "-x", "160", "-y", "50", command).returncode == 0
        first = wait_for(tmux, lambda ls: sorted(rows(ls)) == [0, 1] and min(s for _, s in rows(ls).values()) >= 10, 120)
        assert {r: h for r, (h, _) in rows(first).items()} == {0: "h1", 1: "h2"}
        steps = [line for line in first if line.startswith("[rank 0 h1] step")]
        assert steps and all(STEP_LINE.match(line) for line in steps), steps
        assert any(JOB.match(line) for line in first), first
        assert not any("clusterctl:metrics" in line for line in first)       # they feed the panel only
        before = rows(first)

        tmux("resize-window", "-t", "panel", "-x", "100", "-y", "30")
        second = wait_for(tmux, lambda ls: sorted(rows(ls)) == [0, 1]
                          and all(rows(ls)[r][1] > before[r][1] for r in (0, 1)), 60)
        steps = [line for line in second if line.startswith("[rank 0 h1] step")]
        assert steps and all(STEP_LINE.match(line) for line in steps), steps
        # every rank line is whole: nothing of the panel was written into one
        assert all(line.startswith("[rank ") for line in second if "[rank " in line), second

        tmux("send-keys", "-t", "panel", "C-c")
        end = wait_for(tmux, lambda ls: "EXIT=130" in ls, 60)
        # the first Ctrl-C: every rank finishes its step, writes a checkpoint and stops (docs/run.md#ctrl-c-and-sigterm)
        assert any(re.search(r"stopped: interrupted \(Ctrl-C\): every rank wrote a checkpoint at step \d+ and stopped",
                             line) for line in end), end
        assert tmux("display", "-p", "-t", "panel", "#{cursor_flag}").stdout.strip() == "1"   # the cursor is back
    finally:
        tmux.close()
