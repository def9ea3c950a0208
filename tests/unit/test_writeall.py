"""write_all (hosts/scripts/writeall.py): every byte through a full pipe while signals interrupt the writes
(docs/facts/launchers.md#buffered-writes-and-signals). A child writes 200 long lines with it, a no-op SIGUSR1
handler installed, while this process signals it every half millisecond and reads slowly; what arrives is
compared with what was written, by digest and length."""
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time

CHILD = r'''
import hashlib, os, signal, sys
from clusterctl.hosts.scripts.writeall import write_all
signal.signal(signal.SIGUSR1, lambda *a: None)
os.write(2, b"ready\n")
h = hashlib.sha256()
for i in range(200):
    line = b"%06d " % i + b"y" * 65600 + b"\n"
    h.update(line)
    write_all(1, line)
os.write(2, h.hexdigest().encode() + b"\n")
os.close(1)             # the end of the data; then wait for the signals to stop before exiting
sys.stdin.read()
'''


def test_every_byte_arrives_while_signals_interrupt_the_writes():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    assert child.stderr.readline() == b"ready\n"
    done = threading.Event()

    def pester():
        while not done.is_set():
            try:
                os.kill(child.pid, signal.SIGUSR1)
            except ProcessLookupError:
                return
            time.sleep(0.0005)

    signals = threading.Thread(target=pester)
    signals.start()
    got, size = hashlib.sha256(), 0
    try:
        for line in iter(child.stdout.readline, b""):
            got.update(line)
            size += len(line)
            time.sleep(0.0002)          # a slow reader: the pipe fills, the writes block and are interrupted
    finally:
        done.set()
        signals.join()
        child.stdin.close()
    assert child.wait(30) == 0
    assert size == 200 * (7 + 65600 + 1)
    assert got.hexdigest() == child.stderr.read().decode().strip()
