"""The test cluster's spinwait library (tests/spinwait/README.md) changes how long a would-block socket call takes,
never what it returns."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sshcluster import spinwait_library

PROBE = r"""
import socket, time
a, b = socket.socketpair()
a.setblocking(False)
began = time.perf_counter()
for _ in range(200):
    try:
        a.recv(10)
        raise SystemExit("recv on an empty socket returned")
    except BlockingIOError:
        pass
waited = time.perf_counter() - began
b.send(b"hello")
time.sleep(0.05)
got = a.recv(10)
began = time.perf_counter()
for _ in range(200):
    try:
        a.recv(10, socket.MSG_DONTWAIT)
        raise SystemExit("recv on an empty socket returned")
    except BlockingIOError:
        pass
asked_now = time.perf_counter() - began
print(f"{waited:.4f} {got.decode()} {asked_now:.4f}")
"""


def probe(preload: str | None) -> tuple[float, str, float]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stderr == ""              # a preload that failed to load says so on stderr
    waited, got, asked_now = out.stdout.split()
    return float(waited), got, float(asked_now)


def test_a_would_block_recv_still_says_so_after_waiting_for_its_socket_and_data_comes_through_unchanged():
    library = spinwait_library()
    if library is None:
        pytest.skip("no C compiler to build tests/spinwait/spinwait.c (tests/run.sh installs gcc)")
    plain_wait, plain_got, _ = probe(None)
    waited, got, asked_now = probe(library)
    assert (plain_got, got) == ("hello", "hello")
    # 200 calls that find nothing: each now sleeps 1 ms in poll() (a loop of them no longer spins) ...
    assert waited >= 0.18 and plain_wait < 0.1
    # ... but calls that asked for an answer now (MSG_DONTWAIT) are left alone
    assert asked_now < 0.1
