"""`clusterctl top` on this machine (an inventory of one local host): `--once` prints one table, and without it on a
pipe a table per sample, as `top -b` does (docs/observe.md#clusterctl-top). The fake Macs and the flags:
tests/ssh/test_top.py."""
import threading
import time

import clirun


def inventory(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(f"hosts:\n  - name: here\n    local: true\n    workdir: {tmp_path / 'work'}\n")
    return str(path)


def test_once_prints_one_row_per_host(tmp_path):
    r = clirun.clusterctl("top", "--once", "--hosts", inventory(tmp_path), cwd=tmp_path, own_cache=True)
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["HOST", "STATE", "MEMORY", "PRESSURE", "SWAP", "LOAD", "GPU", "THERMAL", "DISK", "FREE",
                              "RANKS", "FLAGS"]
    assert len(rows) == 1 and rows[0].split()[:2] == ["here", "ok"] and " GiB" in rows[0]


def test_on_a_pipe_it_prints_a_table_per_sample(tmp_path):
    proc = clirun.start("top", "--interval", "0.5", "--hosts", inventory(tmp_path), cwd=tmp_path, own_cache=True)
    seen, deadline = [], time.monotonic() + 60
    while sum(line.startswith("HOST ") for line in seen) < 2 and time.monotonic() < deadline:
        seen.append(proc.stdout.readline())
    proc.kill()
    proc.wait()
    assert sum(line.startswith("HOST ") for line in seen) == 2 and "1 host(s)" in seen[0], seen


def test_a_host_that_refuses_is_asked_once_per_interval_not_in_a_loop(tmp_path):
    """A host whose port refuses answers at once: top still waits an interval between samples, as for one that
    answers (its row says why, every time)."""
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  - name: gone\n    hostname: 127.0.0.1\n    port: 1\n    user: nobody\n")
    proc = clirun.start("top", "--interval", "0.5", "--hosts", str(path), cwd=tmp_path, own_cache=True)
    lines, began = [], time.monotonic()

    def read():
        for line in iter(proc.stdout.readline, ""):
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # counted from its first row: on a loaded machine the process alone may take seconds to start
    while not any(line.startswith("gone ") for line in lines) and time.monotonic() - began < 60:
        time.sleep(0.05)
    time.sleep(3.0)
    proc.kill()
    proc.wait()
    reader.join(5)
    rows = [line for line in lines if line.startswith("gone ")]
    assert 2 <= len(rows) <= 9 and all(row.split()[1] == "unreachable" for row in rows), (len(rows), lines[:6])
