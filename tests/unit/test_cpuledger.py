"""tests/cpuledger.py, the suite's per-test CPU ledger (CLUSTERCTL_TEST_CPU_LOG): a child's CPU is counted to the
group, and the summary adds the rows up by module."""
import json
import os
import subprocess
import sys

import cpuledger
import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_summary_adds_the_tests_up_by_module(tmp_path):
    log = tmp_path / "cpu.jsonl"
    rows = [("tests/ssh/test_a.py::t1", 30.0), ("tests/ssh/test_a.py::t2", 10.0), ("tests/unit/test_b.py::t", 60.0)]
    log.write_text("".join(json.dumps({"id": i, "cpu": c, "wall": c / 2, "worker": "gw0"}) + "\n" for i, c in rows))
    text = cpuledger.summary(str(log))
    assert text.startswith("3 tests, 100 CPU-s")
    modules = text.split("\n\n")[1].splitlines()[1:]
    assert [line.split() for line in modules] == [["60", "60.0%", "1", "tests/unit/test_b.py"],
                                                  ["40", "40.0%", "2", "tests/ssh/test_a.py"]]
    assert text.split("\n\n")[2].splitlines()[1].split() == ["60.0", "30.0", "tests/unit/test_b.py::t"]


def test_a_childs_cpu_is_counted_to_the_group_of_the_process_that_started_it(tmp_path):
    """In a process of its own (the ledger moves the process that makes it into its group)."""
    program = f"""
import json, subprocess, sys, time
sys.path.insert(0, {TESTS!r})
import cpuledger
ledger = cpuledger.Ledger({str(tmp_path / 'cpu.jsonl')!r}, "clusterctl-tests-ledger-{os.getpid()}")
if ledger.group is None:
    print("none")
    sys.exit(0)
cpu0, wall0 = ledger.usage(), time.time()
subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5: pass"])
ledger.record("child", cpu0, wall0)
ledger.close()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    if r.stdout.strip() == "none":
        pytest.skip(f"no control group can be made here: {r.stderr.strip()}")
    [row] = [json.loads(line) for line in (tmp_path / "cpu.jsonl").read_text().splitlines()]
    assert row["id"] == "child" and 0.45 <= row["cpu"] < 5, row
