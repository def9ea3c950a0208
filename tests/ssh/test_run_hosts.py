"""The hosts of a run watched while it runs (observe/hostwatch.py): a fake Mac (tests/fakedarwin/README.md) made to
swap in the middle of a run, by switching its canned telemetry outputs, is named in the run's output once when it
starts and once when it ends, and both are recorded in the run's directory (runs/<id>/hosts.jsonl, summary.json's
"host_events"; docs/observe.md#what-run-records). The pure parts: tests/unit/test_hostwatch.py."""
import json
import re
import threading
import time

import pytest
from sshcluster import requires_private_roots
from test_run import TOKEN, start

from clusterctl.run.options import HOST_SAMPLE_S

pytestmark = pytest.mark.ssh

# every rank reports a step every 0.2 s (a metrics line: the job's step), until the file named by its argument exists
STEPS = """\
import os, sys, time
print("up", flush=True)
step = 0
while not os.path.exists(sys.argv[1]):
    step += 1
    print('clusterctl:metrics {"step": %d}' % step, flush=True)
    time.sleep(0.2)
print("done", flush=True)
"""
STARTED = re.compile(r"^clusterctl: h2 is swapping \(memory pressure critical[^)]*\) since step (\d+)$")
ENDED = re.compile(r"^clusterctl: h2 stopped swapping after (\d+) s$")
SAMPLE_S = HOST_SAMPLE_S


class Lines:
    """The run's output (stdout and stderr merged), read in a thread of its own."""

    def __init__(self, proc):
        self.lines, self.proc = [], proc
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, ok, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in list(self.lines) if ok(line)]
            if found:
                return found[0]
            time.sleep(0.1)
        raise AssertionError("\n".join(self.lines))


def test_a_host_swapping_mid_run_is_named_once_when_it_starts_and_ends_and_recorded(make_cluster, tmp_path):
    requires_private_roots(why="a private /etc/passwd with zsh as the login shell, for the fake Mac")
    cluster = make_cluster(2, darwin={2})
    (tmp_path / "steps.py").write_text(STEPS)
    stop = tmp_path / "stop"
    proc = start("--hosts", str(cluster.inventory), "steps.py", str(stop), cwd=tmp_path)
    out = Lines(proc)
    try:
        out.wait_for(lambda line: line == "[rank 1 h2] up", 90)
        (cluster.host(2).dir / "telemetry").write_text("swapping\n")
        began = STARTED.match(out.wait_for(STARTED.match))
        assert int(began.group(1)) > 0
        time.sleep(SAMPLE_S + 1)            # still swapping at the next sample: nothing more said
        (cluster.host(2).dir / "telemetry").write_text("normal\n")
        ended = ENDED.match(out.wait_for(ENDED.match))
        assert SAMPLE_S <= int(ended.group(1)) <= 30
        stop.touch()
        assert proc.wait(60) == 0, "\n".join(out.lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out.thread.join(10)
    told = [line for line in out.lines if line.startswith("clusterctl: ")]
    assert told == [began.group(0), ended.group(0)], out.lines        # once each; h1, a Linux box, never
    run_id = TOKEN.search("\n".join(out.lines)).group(1)
    run_dir = tmp_path / "runs" / run_id
    events = [json.loads(line) for line in (run_dir / "hosts.jsonl").read_text().splitlines()]
    assert [(e["host"], e["flag"], e["event"], e["step"]) for e in events] == [
        ("h2", "swapping", "started", int(began.group(1))), ("h2", "swapping", "ended", events[1]["step"])]
    assert "memory pressure critical" in events[0]["why"] and events[1]["step"] > events[0]["step"]
    assert abs(events[1]["duration_s"] - int(ended.group(1))) <= 0.6 and events[1]["t"] > events[0]["t"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "ok" and summary["host_events"] == events
    assert cluster.refused(2) == [], f"h2 refused GNU-only usage: {cluster.refused(2)}"
