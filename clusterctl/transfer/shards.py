"""`clusterctl data push`: each host gets only its own dataset shards, verified by sha256 on the host.

Layout on a host (what the trainer is given as its data directory):

    <workdir>/data/<name>/manifest.json                  the whole manifest (every shard's sha256)
    <workdir>/data/<name>/val.bin                        held-out tokens, on every host
    <workdir>/data/<name>/shard-0000R-of-0000N.bin       one per rank R the host runs (rank order =
                                                         inventory order; a host with slots: 2 gets two)

`name` is the data directory's base name unless given. Per host, in parallel:
  1. one command hashes what the host already has; files whose sha256 matches the manifest are not sent;
  2. the rest go to `<dir>/.incoming/` (rsync over ssh, or SFTP), atomically per file;
  3. one command hashes each staged file ON the host, renames those that match into place (manifest.json
     last, so a manifest never names a shard that is not there yet), deletes any that do not (an error),
     and removes every other `shard-*-of-*.bin` there: another world size's, or another rank's.
A manifest whose world_size differs from the inventory's is refused before anything moves.

The manifest is read and validated by the data package's reader (clusterctl.data.shards.read_manifest), the
same one the trainer uses; push_shards also takes an already-read Manifest.
"""
from __future__ import annotations

import os
import posixpath
import time
from dataclasses import dataclass, field

from ..data.shards import MANIFEST, SHARD_NAME, Manifest, read_manifest
from ..digest import file_sha256
from ..errors import ShardError, ShardVerifyError
from ..hosts.connector import Connector
from ..hosts.fanout import GroupResult, run_all
from ..inventory import Cluster, Host
from . import remotefiles
from .push import Uploader, local_rsync, rsync_else_sftp, rsync_push, rsync_target
from .sync import Progress

STAGE = ".incoming"


@dataclass
class HostPush:
    host: str
    dir: str
    ranks: list[int]
    sent: list[str] = field(default_factory=list)
    sent_bytes: int = 0
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)       # stale shards deleted on the host
    method: str = ""
    elapsed_s: float = 0.0


def files_for_host(manifest: Manifest, host: Host, all_shards: bool = False) -> list[tuple[str, str]]:
    """(file, sha256) a host must hold: its ranks' shards (`all_shards`: every shard, so that the bundled
    trainer's balancing can hand a faster rank rows of any other: docs/trainer.md#balanced-data-parallelism),
    val.bin, the tokenizer.json of an HF-tokenized dataset; the manifest is sent last, separately."""
    ranks = range(len(manifest.shards)) if all_shards else host.ranks
    out = [(manifest.shards[r].file, manifest.shards[r].sha256) for r in ranks]
    out.append((manifest.val.file, manifest.val.sha256))
    tokenizer = manifest.tokenizer or {}
    if tokenizer.get("path") and tokenizer.get("sha256"):
        out.append((tokenizer["path"], tokenizer["sha256"]))   # an HF tokenizer.json the ranks need too
    return out


def check_world(data_dir: str, manifest: Manifest, cluster: Cluster) -> None:
    """A dataset prepared for another world size is refused before anything moves or launches."""
    world = manifest.world_size
    if world != cluster.world_size:
        raise ShardError(f"{data_dir} was prepared for world size {world}, but the inventory has "
                         f"{cluster.world_size} ranks: run `clusterctl data prepare --world {cluster.world_size}`")


def push_shards(connector: Connector, data_dir: str, manifest: Manifest | None = None, name: str | None = None,
                timeout: float = 7200.0, method: str = "auto", progress: Progress | None = None,
                all_shards: bool = False) -> GroupResult:
    """Push data_dir's shards: host i (rank order) of the connector's cluster gets its ranks' shards (every
    shard with `all_shards`), val and the manifest."""
    cluster = connector.cluster
    data_dir = os.path.abspath(data_dir)
    if manifest is None:
        manifest = read_manifest(data_dir)
    check_world(data_dir, manifest, cluster)
    name = name or os.path.basename(data_dir.rstrip("/"))
    if not name or "/" in name or name.startswith("."):
        raise ShardError(f"--name {name!r} must be a plain directory name")
    for host in cluster.hosts:
        for file, _ in files_for_host(manifest, host, all_shards):
            if not os.path.isfile(os.path.join(data_dir, file)):
                raise ShardError(f"{os.path.join(data_dir, file)}: missing (named by the manifest)")
    manifest_sha = file_sha256(os.path.join(data_dir, MANIFEST))
    rsync = local_rsync(method)

    def one(host: Host) -> HostPush:
        return _push_host(connector, host, data_dir, manifest, name, manifest_sha, method, rsync, progress, all_shards)

    return run_all(cluster.hosts, one, connector.deadline(timeout, slack=0))


def remote_dir(host: Host, name: str) -> str:
    return posixpath.join(host.workdir, "data", name)


def _push_host(connector: Connector, host: Host, data_dir: str, manifest: Manifest, name: str, manifest_sha: str,
               method: str, rsync: str | None, progress: Progress | None, all_shards: bool = False) -> HostPush:
    start = time.monotonic()
    wanted = files_for_host(manifest, host, all_shards) + [(MANIFEST, manifest_sha)]
    target_dir = remote_dir(host, name)
    report = HostPush(host.name, target_dir, list(host.ranks))
    with connector.transport(host) as transport:
        have = remotefiles.call(transport, host.python, "scan", {
            "root": target_dir, "paths": [f for f, _ in wanted], "hash": True, "dry": True})["files"]
        send = [(f, sha) for f, sha in wanted if (have.get(f) or [None])[0] != sha]
        report.unchanged = [f for f, _ in wanted if (f, _) not in send]
        total = sum(os.path.getsize(os.path.join(data_dir, f)) for f, _ in send)
        on_bytes = (lambda done: progress(host.name, min(done, total), total)) if progress else None
        stage = posixpath.join(target_dir, STAGE)
        if send:
            report.method = _transfer(connector, transport, host, data_dir, [f for f, _ in send], stage, method,
                                      rsync, on_bytes)
        verdict = remotefiles.call(transport, host.python, "verify", {
            "root": target_dir, "stage": STAGE, "files": send, "keep": [f for f, _ in wanted],
            "stale": SHARD_NAME.pattern, "check": [f for f, _ in wanted]})
    if verdict["bad"]:
        raise ShardVerifyError(f"{host.name}: sha256 of {', '.join(verdict['bad'])} on the host does not match "
                               "the manifest (the copy was deleted): the local file differs from its manifest "
                               "entry, or was corrupted in transit")
    missing = [f for f, sha in wanted if verdict["have"].get(f) != sha]
    if missing:
        raise ShardVerifyError(f"{host.name}: {', '.join(missing)} not in place in {target_dir} after the transfer")
    report.sent = [f for f, _ in send]
    report.sent_bytes = total
    report.removed = verdict["stale"]
    if progress:
        progress(host.name, total, total)
    report.elapsed_s = time.monotonic() - start
    return report


def _transfer(connector: Connector, transport, host: Host, data_dir: str, files: list[str], stage: str,
              method: str, rsync: str | None, on_bytes) -> str:
    """Copy files into the host's stage directory; rsync when both ends have it, else SFTP."""
    def with_rsync() -> None:
        to = rsync_target(connector, host, stage)
        rsync_push(rsync, data_dir, files, to, on_bytes=on_bytes)

    def with_sftp() -> None:
        remotefiles.call(transport, host.python, "scan", {"root": stage})       # creates it, clears leftovers
        done = 0

        def count(n: int) -> None:
            nonlocal done
            done += n
            if on_bytes:
                on_bytes(done)

        with Uploader(transport, count) as up:
            for f in files:
                src = os.path.join(data_dir, f)
                up.put(src, posixpath.join(stage, f), os.stat(src).st_mode & 0o777)

    # this machine as a host: plain copies (hashed and renamed by the same helper as on any host)
    _, used, _ = rsync_else_sftp(method, None if host.local else rsync, with_rsync, with_sftp)
    return used
