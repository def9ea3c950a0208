"""A small filesystem of its own for a test host's root: a tmpfs this machine mounts (and a test binds over a host's
root with SSHCluster.mount_over), filled to the last byte and freed again by the test, as a user's disk fills.

    with SmallDisk(tmp_path / "h2disk", "24m") as disk:   # None: this machine cannot mount one (why: SmallDisk.why)
        cluster.mount_over(2, str(cluster.host_root), str(disk.path))
        disk.fill(); ...; disk.free()
"""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path


class SmallDisk:
    def __init__(self, path: Path, size: str = "24m"):
        self.path, self.size = Path(path), size
        self.filler = self.path / "filler"
        self.why: str | None = None

    def __enter__(self) -> "SmallDisk | None":
        self.path.mkdir(parents=True, exist_ok=True)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755", "tmpfs", str(self.path)],
                                 capture_output=True, text=True)
        if mounted.returncode != 0:
            self.why = f"this machine cannot mount a tmpfs ({mounted.stderr.strip()})"
            return None
        return self

    def __exit__(self, *exc) -> None:
        if self.why is None:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)

    def fill(self, leave: int = 0) -> None:
        """Write until the disk is full, then give back `leave` bytes."""
        # unbuffered: a buffered file's close would write what it still holds, and meet ENOSPC outside the loop
        with open(self.filler, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
        if leave:
            os.truncate(self.filler, max(self.filler.stat().st_size - leave, 0))

    def free(self) -> None:
        try:
            os.remove(self.filler)
        except FileNotFoundError:
            pass
