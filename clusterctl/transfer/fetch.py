"""`run --fetch PATH`: what a job wrote outside its run directory (adapters, `--out outdir`), brought home.

    paths = check_fetch_paths(["outdir", "/scratch/model.bin"])     # pure: refuses `..` escapes (exit 2)
    local_destination(paths[0], project, run_dir)                    # pure: ./outdir here
    fetch_outputs(connector, paths, project, run_dir, all_ranks=False) -> [Fetched, ...]

Where PATH lands (local_destination):
    relative PATH (to the host's workdir)   -> <project>/PATH, the same relative path here
    absolute PATH on the host (/x, ~/x)     -> runs/<id>/fetched/<basename>
    with all_ranks, from every host         -> runs/<id>/host-<name>/PATH  (absolute: .../host-<name>/fetched/<basename>)

Each PATH (a file or a directory) comes over the route sync uses the other way (push.py): rsync over
`ssh -F <the one rendering>` when this machine and the host both have it, else the host's file session
(SFTP), sending only files whose sha256 differs. Either way an unchanged file is not sent again and every
file lands under a temporary name and is renamed into place. A PATH the host does not have is reported,
never an error; a PATH that is already here (rank 0 ran on this machine, in this directory) is not copied.
"""
from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Callable

from ..atomic import replacing
from ..digest import file_sha256
from ..errors import UsageError
from ..hosts.connector import Connector
from ..hosts.fanout import run_all
from ..hosts.files import TMP_MARK
from ..hosts.quoting import quote_path
from ..hosts.scripts.contract import LINK
from ..inventory import Host
from . import remotefiles
from .push import local_rsync, rsync_else_sftp, rsync_pull, rsync_target

FETCH_TIMEOUT_S = 3600.0           # per host, every PATH
PROBE_TIMEOUT_S = 30.0
RSYNC_EXCLUDES = (f"*{TMP_MARK}*",)  # a file still being uploaded to the host (hosts/files.py)
Progress = Callable[[str, int, int], None]     # (host name, bytes done, bytes total)


# ---- pure: which paths, and where they land ------------------------------------------------------

@dataclass(frozen=True)
class FetchPath:
    given: str                     # as the user wrote it
    path: str                      # normalised: relative to the workdir, or absolute ("/x", "~/x")

    @property
    def absolute(self) -> bool:
        return self.path.startswith(("/", "~/"))

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)


def check_fetch_paths(given) -> tuple[FetchPath, ...]:
    """--fetch values -> FetchPaths (duplicates dropped); UsageError for a path that leaves the workdir,
    names the whole workdir or file system, or lands where another absolute path lands."""
    paths: dict[str, FetchPath] = {}
    for text in given:
        if text.startswith("~") and not (text == "~" or text.startswith("~/")):
            raise UsageError(f"--fetch {text!r}: only ~/ (the home of the inventory's user) is understood")
        home = text.startswith("~")
        absolute = home or text.startswith("/")
        # "~/a/../b" is "~/b"; normalised below "/" so that "~/.." cannot turn into a relative path
        clean = "~" + posixpath.normpath(text[1:] or "/") if home else posixpath.normpath(text)
        if not text.strip() or clean in (".", "/", "//", "~/"):
            raise UsageError(f"--fetch {text!r}: name what the job wrote (a file or directory), not the whole "
                             "workdir, home or file system")
        if not absolute and (clean == ".." or clean.startswith("../")):
            raise UsageError(f"--fetch {text!r} leaves the workdir: a relative PATH must stay inside rank 0's "
                             "workdir (give an absolute path for anything elsewhere on the host)")
        paths.setdefault(clean, FetchPath(text, clean))
    names: dict[str, str] = {}
    for p in paths.values():
        if p.absolute and names.setdefault(p.name, p.given) != p.given:
            raise UsageError(f"--fetch {names[p.name]!r} and {p.given!r} would both land in runs/<id>/fetched/"
                             f"{p.name}: fetch their parent directory instead")
    return tuple(paths.values())


def remote_path(host: Host, path: FetchPath) -> str:
    """PATH on the host: inside its workdir unless absolute."""
    return path.path if path.absolute else posixpath.join(host.workdir, path.path)


def local_destination(path: FetchPath, project: str, run_dir: str, host_name: str | None = None) -> str:
    """Where PATH lands here (module docstring); with host_name, the per-host copy of --fetch-all-ranks."""
    root = project if host_name is None else os.path.join(run_dir, f"host-{host_name}")
    if path.absolute:
        return os.path.join(run_dir if host_name is None else root, "fetched", path.name)
    return os.path.join(root, *path.path.split("/"))


@dataclass
class Fetched:
    """What became of one PATH from one host."""

    path: FetchPath
    host: str
    source: str                    # the path on the host
    dest: str                      # the path here
    status: str                    # "copied", "here" (nothing to copy), "missing" or "failed"
    kind: str = ""                 # "dir" or "file" (not for missing / failed)
    files: int = 0                 # files moved (an unchanged file is not)
    nbytes: int = 0
    method: str = ""               # "rsync", "sftp", or "" when nothing was copied
    error: BaseException | None = None


# ---- moving ----------------------------------------------------------------------------------------

def fetch_outputs(connector: Connector, paths, project: str, run_dir: str, *, all_ranks: bool = False,
                  method: str = "auto", progress: Progress | None = None) -> list[Fetched]:
    """Bring every PATH home from rank 0's host (the first), or with all_ranks from every host at once.
    One Fetched per (host, PATH), in host then PATH order; failures are recorded, never raised.
    `progress(host, done, total)`: each host's bytes as they come, of the total its PATHs held when they
    were looked at, before any moved (an unchanged file, which does not move, is taken off it as each PATH ends)."""
    rsync = local_rsync(method)
    hosts = connector.cluster.hosts if all_ranks else connector.cluster.hosts[:1]

    def one_host(host: Host) -> list[Fetched]:
        found = [_look(connector, host, p, local_destination(p, project, run_dir, host.name if all_ranks else None))
                 for p in paths]
        meter = _Meter(host.name, sum(nbytes for f, nbytes in found if f.status == "copied"), progress)
        for f, nbytes in found:
            if f.status == "copied":
                _copy(connector, host, f, nbytes, rsync, method, meter)
        return [f for f, _ in found]

    group = run_all(hosts, one_host, connector.deadline(FETCH_TIMEOUT_S, slack=0))
    fetched: list[Fetched] = []
    for host in hosts:
        outcome = group[host.name]
        fetched += outcome.value if outcome.ok else [
            Fetched(p, host.name, remote_path(host, p), "", "failed", error=outcome.error) for p in paths]
    return fetched


class _Meter:
    """One host's bytes fetched, told as progress(host, done, total): the total is what the host's PATHs held
    when they were looked at; a PATH that moved less (unchanged files) or more (grown since) corrects it as it
    ends."""

    def __init__(self, host: str, total: int, progress: Progress | None):
        self.host, self.total, self.progress, self.base = host, total, progress, 0

    def tell(self, done: int) -> None:
        if self.progress is not None:
            self.progress(self.host, done, max(self.total, done))

    def ended(self, expected: int, moved: int) -> None:
        self.total += moved - expected
        self.base += moved
        self.tell(self.base)


def _look(connector: Connector, host: Host, path: FetchPath, dest: str) -> tuple[Fetched, int]:
    """(what PATH is on the host: copied (to be), missing, here or failed; the bytes of its files there)."""
    source = remote_path(host, path)
    result = Fetched(path, host.name, source, dest, "copied")
    nbytes = 0
    try:
        with connector.transport(host) as transport:
            result.kind, nbytes = _kind(transport, source)
        if result.kind == "missing":
            result.status, result.kind = "missing", ""
        elif host.local and os.path.realpath(os.path.expanduser(source)) == os.path.realpath(dest):
            result.status = "here"
    except Exception as e:  # noqa: BLE001 - this path's failure is reported; the other paths go on
        result.status, result.error = "failed", e
    return result, nbytes


def _copy(connector: Connector, host: Host, result: Fetched, expected: int, rsync: str | None, method: str,
          meter: _Meter) -> None:
    """Copy what _look found (result.status "copied"), into result's figures; a failure is recorded in it."""
    source, dest, path = result.source, result.dest, result.path
    base = meter.base
    got = 0

    def on_bytes(done: int) -> None:           # rsync: the bytes so far
        meter.tell(base + done)

    def on_chunk(n: int) -> None:              # SFTP: each chunk's
        nonlocal got
        got += n
        meter.tell(base + got)

    try:
        # a directory: its tree into dest; a file: its name from its directory into dest's
        root, names, local_root = ((source, list(RSYNC_EXCLUDES), dest) if result.kind == "dir" else
                                   (posixpath.dirname(source), [path.name], os.path.dirname(dest)))
        (result.files, result.nbytes), result.method, _ = rsync_else_sftp(
            method, rsync,
            lambda: _with_rsync(connector, host, rsync, root, names, local_root, result.kind == "dir", on_bytes),
            lambda: _with_sftp(connector, host, root, None if result.kind == "dir" else names, local_root, on_chunk))
        meter.ended(expected, result.nbytes)
    except Exception as e:  # noqa: BLE001 - this path's failure is reported; the other paths go on
        result.status, result.error = "failed", e
        meter.ended(expected, 0)


def _kind(transport, source: str) -> tuple[str, int]:
    """(dir, file or missing; the bytes of the regular files it holds: `ls -ln`'s fifth column, as GNU and BSD
    ls both print it)."""
    def size(target: str) -> str:
        return f'ls -lnRA {target} 2>/dev/null | awk \'/^-/ {{ s += $5 }} END {{ printf "%.0f\\n", s }}\''

    in_dir, the_file = size('"$p/"'), size('"$p"')      # "$p/": a link to a directory is followed, as rsync does
    script = (f'p={quote_path(source)}; if [ -d "$p" ]; then echo dir; {in_dir}; elif [ -e "$p" ] || [ -L "$p" ]; '
              f'then echo file; {the_file}; else echo missing; fi')
    result = transport.run(script, PROBE_TIMEOUT_S)
    words = result.stdout.split()
    kind = words[0] if words else ""
    if not result.ok or kind not in ("dir", "file", "missing") or len(words) > 2:
        raise OSError(f"could not look for {source}: {(result.stderr or result.stdout).strip() or result.exit_code}")
    return kind, int(words[1]) if len(words) == 2 and words[1].isdigit() else 0


def _with_rsync(connector: Connector, host: Host, rsync: str, root: str, items: list[str], local_root: str,
                excludes: bool, on_bytes=None) -> tuple[int, int]:
    source = rsync_target(connector, host, root)
    summary = rsync_pull(rsync, source, items, local_root, excludes=excludes, on_bytes=on_bytes)
    return len(summary.moved), summary.moved_bytes


def _with_sftp(connector: Connector, host: Host, root: str, names: list[str] | None,
               local_root: str, on_bytes=None) -> tuple[int, int]:
    """The host hashes its files (hosts/scripts/filehelper.py) and only those whose sha256 differs from
    the copy here are fetched (names None: every file under root)."""
    files = nbytes = 0
    with connector.transport(host) as transport:
        if names is None:
            names = remotefiles.call(transport, host.python, "scan", {"root": root, "list": True, "dry": True})["tree"]
        state = remotefiles.call(transport, host.python, "scan",
                                 {"root": root, "paths": names, "hash": True, "dry": True})["files"]
        with transport.files() as session:
            for rel in names:
                have, target = state.get(rel), inside(local_root, rel, host.name)
                if have is None or have[0] in (None, "other") or _same(target, have[0]):
                    continue
                os.makedirs(os.path.dirname(target), exist_ok=True)
                inside(local_root, rel, host.name)      # again: no directory on the way is a link out of it
                if have[0].startswith(LINK):
                    with replacing(target) as tmp:
                        os.symlink(have[0][len(LINK):], tmp)
                else:
                    # replaces a link there, never follows it
                    if on_bytes is None:
                        session.get(posixpath.join(root, rel), target)
                    else:
                        session.get(posixpath.join(root, rel), target, on_bytes=on_bytes)
                    os.chmod(target, have[1] & 0o777)                  # no setuid, setgid or sticky bit from a host
                    nbytes += os.path.getsize(target)
                files += 1
    return files, nbytes


def inside(local_root: str, rel: str, host: str) -> str:
    """Where a file the host listed as `rel` goes under `local_root`; OSError for a name that would land
    elsewhere: absolute, with `..`, `.`, an empty part or a backslash, or below a directory here that is a
    link out of `local_root` (an earlier fetch recreates the host's links: one must never be written through)."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise OSError(f"{host} listed {rel!r}, which is not a path inside {local_root}: refused")
    target = os.path.join(local_root, *parts)
    root = os.path.realpath(local_root)
    parent = os.path.realpath(os.path.dirname(target))
    if parent != root and not parent.startswith(root + os.sep):
        raise OSError(f"{host} listed {rel!r}, which a link here leads out of {local_root} (to {parent}): refused")
    return target


def _same(target: str, want: str) -> bool:
    if want.startswith(LINK):
        return os.path.islink(target) and os.readlink(target) == want[len(LINK):]
    return os.path.isfile(target) and not os.path.islink(target) and file_sha256(target) == want
