"""rsync over ssh: the argv (pure), its output (pure parsers), and running it under a watchdog.

rsync lands every file atomically by itself: it writes `.NAME.XXXXXX` beside the destination and renames
it when complete, so an interrupted transfer never leaves a truncated file under the final name.
`--delay-updates` (all renames at the end) is not used: after an interruption it leaves a `.~tmp~`
directory behind, and per-file atomicity is what a reader of any one file needs.

The file list is ours (filelist.py), given with `--files-from`, so rsync ships exactly what git or the
.gitignore rules chose. The remote side is started through `--rsync-path` as `mkdir -p DEST && cd DEST &&
rsync`, which creates the destination with any rsync version and needs no remote path quoting by rsync;
when the host has no rsync it prints MISSING_MARK and the caller falls back to SFTP.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..atomic import scratch_file
from ..errors import ConnectError, RsyncFailed, RsyncMissing
from ..hosts.quoting import quote_path
from ..hosts.remote import remote_command

MISSING_MARK = "clusterctl: rsync is not installed on this host"
OUT_FORMAT = "%i %l %n"            # itemized changes, file length, name
IO_TIMEOUT_S = 120                 # rsync --timeout: a stalled connection ends the transfer
PARTIAL_OK = (24,)                 # "some source files vanished": the rest was transferred


# ---- pure: argv ---------------------------------------------------------------------------------

def remote_rsync_path(dest: str, create: bool = True, then: str | None = None) -> str:
    """What the host runs instead of plain `rsync`: create (unless pulling from it) and enter the
    destination, check for rsync; with `then`, a POSIX sh command run there, in the destination, once rsync
    has ended well (rsync appends its own arguments: a function takes them, as sh, bash and zsh all allow)."""
    d = quote_path(dest)
    body = (f"{f'mkdir -p {d} && ' if create else ''}cd {d} && {{ command -v rsync >/dev/null 2>&1 || "
            f"{{ echo {shlex.quote(MISSING_MARK)} >&2; exit 127; }}; }} && ")
    if then is None:
        return body + "rsync"
    return f"clusterctl_rsync() {{ rsync \"$@\" && {then}; }}; {body}clusterctl_rsync"


def ssh_command(ssh_options: Sequence[str], ssh: str = "ssh") -> str:
    """rsync's `-e`: rsync splits it on spaces but honours quotes, so shlex quoting survives paths with
    spaces."""
    return shlex.join([ssh, *ssh_options])


def rsync_argv(rsync: str, src: str, list_file: str, dest: str, *, target: str | None = None,
               rsh: str | None = None, checksum: bool = False, dry_run: bool = False,
               bwlimit_kbps: int | None = None, progress: bool = False, excludes: bool = False,
               pull: bool = False, extra: Sequence[str] = (), then: str | None = None) -> list[str]:
    """Push the files named (NUL-separated, relative to src) in list_file to dest on target (or to the
    local directory dest when target is None); with `excludes`, list_file holds exclude rules instead and
    the tree is walked recursively (filelist.exclusion_rules). With `pull`, the other way round: src is
    the directory on target, dest the one here. -l -p -t: symlinks, permissions, times; never owners (the
    user on the host may not exist here). `extra`: more options of the caller's (the model store's
    --partial-dir). `then`: a command the host runs in dest once rsync has ended well (remote_rsync_path)."""
    selection = ["-r", "--exclude-from", list_file] if excludes else ["--files-from", list_file]
    # --from0 first: rsync reads --exclude-from when it meets it on the command line
    argv = [rsync, "-lpt", "--from0", *selection, f"--out-format={OUT_FORMAT}", "--stats",
            f"--timeout={IO_TIMEOUT_S}"]
    if checksum:
        argv.append("--checksum")
    if dry_run:
        argv.append("--dry-run")
    if bwlimit_kbps:
        argv.append(f"--bwlimit={bwlimit_kbps}")
    if progress:
        argv.append("--info=progress2")
    argv += extra
    if target is None:
        return argv + ["--", src.rstrip("/") + "/", dest.rstrip("/") + "/"]
    if pull:
        return argv + ["-e", rsh or "ssh", f"--rsync-path={remote_rsync_path(src, create=False)}", "--",
                       f"{target}:./", dest.rstrip("/") + "/"]
    return argv + ["-e", rsh or "ssh", f"--rsync-path={remote_rsync_path(dest, then=then)}", "--",
                   src.rstrip("/") + "/", f"{target}:."]


# ---- pure: output -------------------------------------------------------------------------------

@dataclass
class RsyncSummary:
    moved: list[str] = field(default_factory=list)        # files whose content was sent (or would be)
    moved_bytes: int = 0                                  # their sizes
    attrs_only: list[str] = field(default_factory=list)   # only times / permissions updated
    wire_bytes: int | None = None                         # "Total bytes sent" (--stats)


# The itemize string is YX plus 7 attribute letters in rsync 2.6.9 and openrsync (`YXcstpogz`: a Mac's
# /usr/bin/rsync), 9 in rsync 3.x (`YXcstpoguax`), 10 in a 3.2 build with --fflags; "Total bytes sent: N"
# in rsync, "Total sent: N B" in openrsync (docs/facts/macos.md#mac-rsync-output, tests/fixtures/rsync/).
_ITEM = re.compile(r"^([<>ch.*][fdLDS][.+?a-zA-Z ]{7,10}) (\d+) (.*)$")
_PROGRESS = re.compile(r"^\s*([\d,.]+)\s+(\d+)%")
_STAT = re.compile(r"^Total (?:bytes )?sent: ([\d,.]+)(?: B)?$")


def parse_item(line: str, summary: RsyncSummary) -> bool:
    """Fold one `--out-format='%i %l %n'` line into summary; False when the line is not an item."""
    m = _ITEM.match(line)
    if not m:
        return False
    flags, size, name = m.group(1), int(m.group(2)), m.group(3)
    if flags[1] == "d":
        return True                                        # directories are implied, not counted
    if flags[0] in "<>" or (flags[0] == "c" and flags[1] in "LDS"):
        summary.moved.append(name)
        summary.moved_bytes += size if flags[1] == "f" else 0
    elif flags[0] == ".":
        summary.attrs_only.append(name)
    return True


def parse_output(text: str) -> RsyncSummary:
    """An rsync run's whole stdout (items, progress2 updates, --stats) -> RsyncSummary."""
    summary = RsyncSummary()
    for line in re.split(r"[\r\n]", text):
        if parse_item(line, summary):
            continue
        m = _STAT.match(line)
        if m:
            summary.wire_bytes = _number(m.group(1))
    return summary


def parse_progress(line: str) -> int | None:
    """Bytes done from an `--info=progress2` update ('  1,234,567  45%  12.34MB/s  0:00:01 ...')."""
    m = _PROGRESS.match(line)
    return _number(m.group(1)) if m else None


def _number(text: str) -> int:
    return int(text.replace(",", "").replace(".", ""))


# ---- running --------------------------------------------------------------------------------------

_PROGRESS2: bool | None = None


def supports_progress2(rsync: str) -> bool:
    """--info=progress2 came with rsync 3.1 (macOS's /usr/bin/rsync 2.6.9 and openrsync lack it)."""
    global _PROGRESS2
    if _PROGRESS2 is None:
        try:
            out = subprocess.run([rsync, "--version"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        m = re.search(r"version (\d+)\.(\d+)", out)
        _PROGRESS2 = bool(m) and (int(m.group(1)), int(m.group(2))) >= (3, 1) and "openrsync" not in out
    return _PROGRESS2


def run_rsync(host: str, argv_for_list: Callable[[str], list[str]], items: Sequence[str],
              on_bytes: Callable[[int], None] | None = None) -> RsyncSummary:
    """Run rsync (argv built around the list file we write) behind the transport's watchdog: if this
    process dies, even by SIGKILL, the watchdog's stdin (our pipe) closes and it kills rsync and its ssh,
    so no transfer outlives us. `on_bytes(done)` gets progress2's running byte count."""
    fd, list_file = scratch_file("clusterctl-files-")      # one a killed push left is removed here
    try:
        with os.fdopen(fd, "wb") as f:
            f.write("".join(item + "\0" for item in items).encode("utf-8", "surrogateescape"))
        argv = argv_for_list(list_file)
        proc = subprocess.Popen(["/bin/sh", "-c", remote_command(shlex.join(argv))], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        err = bytearray()
        reader = threading.Thread(target=lambda: err.extend(proc.stderr.read()), daemon=True)
        reader.start()
        pending, out = b"", bytearray()
        try:
            while chunk := proc.stdout.read1(65536):
                out += chunk
                pending += chunk
                *lines, pending = re.split(rb"[\r\n]", pending)
                for raw in lines:
                    line = raw.decode("utf-8", "surrogateescape")
                    done = parse_progress(line)
                    if done is not None and on_bytes:
                        on_bytes(done)
            proc.wait()
        finally:
            proc.stdin.close()          # the watchdog ends; if rsync still runs (we were interrupted) it dies
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(5)
        stderr = err.decode("utf-8", "replace")
        summary = parse_output(out.decode("utf-8", "surrogateescape"))
    finally:
        os.unlink(list_file)
    if MISSING_MARK in stderr:
        raise RsyncMissing(f"{host}: rsync is not installed on the host")
    if proc.returncode == 255 or (proc.returncode == 12 and "ssh:" in stderr):
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip() and not ln.startswith("rsync")]
        raise ConnectError(host, lines[-1] if lines else stderr.strip() or "ssh failed")
    if proc.returncode not in (0, *PARTIAL_OK):
        raise RsyncFailed(host, proc.returncode, stderr)
    return summary
