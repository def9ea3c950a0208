"""What `run` puts on the hosts before it launches, so a job needs nothing copied by hand:

    stage_project(connector, root)      the project directory (`clusterctl sync`) into every host's workdir
                                        (project_copy: checked now, copied later, its end marked for
                                        ranks that started beside it)
    ship_clusterctl(connector)          clusterctl itself into <workdir>/.clusterctl/lib on every other
                                        machine, for the bundled trainer (the rank bootstrap puts that
                                        directory on sys.path), so hosts need only python and mlx
    stage_data(connector, data_dir)     each host only its own dataset shards (`clusterctl data push`)
and after the job:
    fetch_run_dir(connector, run_id, ...)  what the job wrote in runs/<id>/ on the first host, brought home

Each is incremental (a second run moves nothing) and raises StageError naming every host that failed.
"""
from __future__ import annotations

import os
from typing import Callable

from ..errors import EXIT_CONNECT, ConnectError, StageError, UsageError
from ..hosts.connector import Connector
from ..hosts.fanout import GroupResult
from ..hosts.scripts.contract import COPY_GATE_ENV  # noqa: F401 (run/hooks.py's, from here)

LIB_DIR = ".clusterctl/lib"          # relative to each host's workdir
COPIES_DIR = ".clusterctl/copies"    # relative to each host's workdir: the marks of copies that ended (project_copy)
# a launch that starts beside the project's copy gives its ranks COPY_GATE_ENV (the copy's token): the rank bootstrap
# waits for the mark of that token on its host before it runs the program (hosts/scripts/bootstrap.py)
Progress = Callable[[str, int, int], None]       # (host name, bytes done, bytes total): a long copy's progress


def _is_here(host, root: str) -> bool:
    return host.local and os.path.realpath(os.path.expanduser(host.workdir)) == os.path.realpath(root)


def _others(connector: Connector, keep) -> Connector:
    """The connector for the hosts `keep` says need a copy (ranks as they are: not a smaller world)."""
    from dataclasses import replace
    cluster = connector.cluster
    return connector.narrowed(replace(cluster, hosts=tuple(h for h in cluster.hosts if keep(h))))


def _check(group: GroupResult, what: str, hint: str = "--no-sync skips copying") -> GroupResult:
    """The copy's outcome; StageError naming each host it failed on: exit 3 (as the pre-flight's) when every one
    of them could not be reached, else 1."""
    if group.failed:
        details = "; ".join(str(o.error) if str(o.error).startswith(name) else f"{name}: {o.error}"
                            for name, o in group.failed.items())
        error = StageError(f"could not copy {what}: {details} ({hint})")
        if all(isinstance(o.error, ConnectError) for o in group.failed.values()):
            error.exit_code = EXIT_CONNECT
        raise error
    return group


def stage_project(connector: Connector, root: str, needed: tuple[str, ...] = (),
                  excludes: tuple[str, ...] = (), progress: Progress | None = None) -> GroupResult | None:
    """Mirror the project at `root` into every host's workdir (not into itself on this machine). Refuses
    a home directory or `/`: run from the project, or pass --no-sync. `needed`: paths in the project the
    program reads (the bundled trainer's --model and --data), refused before anything moves when the
    project's ignore rules leave them out of the copy (a .gitignore'd models/ is common). `excludes`: gitignore
    patterns left out besides (run's model, which goes to the hosts' model stores). `progress(host, done,
    total)`: each host's bytes as the copy runs (transfer/sync.py sync_tree)."""
    send = project_copy(connector, root, needed, excludes=excludes, progress=progress)
    return send() if send is not None else None


def project_copy(connector: Connector, root: str, needed: tuple[str, ...] = (), gate: str | None = None,
                 excludes: tuple[str, ...] = (), progress: Progress | None = None) -> Callable[[], GroupResult] | None:
    """stage_project in two: what is checked here and now (the refusals above, the files to send: no host is
    asked), and the copy itself, returned to be called (None: no host needs one). With `gate` (a token), the
    copy's end is marked on every host for ranks that wait for it (COPY_GATE_ENV): an empty file of that name in
    <workdir>/.clusterctl/copies/, made in the SSH session rsync used; on the hosts whose workdir is the project
    itself, here, before the copy starts."""
    from .sync import SyncOptions, plan_sync, sync_tree

    root = os.path.realpath(root)
    targets = _others(connector, lambda h: not _is_here(h, root))
    if not targets.cluster.hosts:
        return None
    if root in (os.path.realpath(os.path.expanduser("~")), "/"):
        raise StageError(f"not copying {root} to every host: run from your project directory, or pass --no-sync")
    options = SyncOptions(done_mark=f"{COPIES_DIR}/{gate}" if gate else None, excludes=excludes)
    plan = plan_sync(root, options)
    shipped = {e.rel for e in plan.entries}
    for path in needed:
        rel = os.path.relpath(os.path.realpath(os.path.join(root, path)), root).replace(os.sep, "/")
        if rel.startswith("../") or not os.path.exists(os.path.join(root, rel)):
            continue          # outside the project (it must be on the hosts already) or absent (the program says)
        if not any(f == rel or f.startswith(rel.rstrip("/") + "/") for f in shipped):
            raise UsageError(f"{path}: the program reads it, but the project's ignore rules (.gitignore, "
                             f"{plan.selection}) leave it out of what run copies to the hosts: un-ignore it "
                             "(a `!path` line), or give an absolute path that exists on every host")

    def send() -> GroupResult:
        for host in connector.cluster.hosts:
            if gate and _is_here(host, root):
                mark = os.path.join(root, COPIES_DIR, gate)
                os.makedirs(os.path.dirname(mark), exist_ok=True)
                open(mark, "ab").close()
        return _check(sync_tree(targets, plan, options, progress), f"the project {root}")

    return send


def ship_clusterctl(connector: Connector, what: str = "the bundled trainer",
                    hint: str = "--no-sync skips copying") -> GroupResult | None:
    """clusterctl's own package, the version running here, into <workdir>/.clusterctl/lib/clusterctl on
    every host that is not this machine (which runs the installed one); `what` needs it, `hint` is the way round a
    failed copy that the caller's command offers."""
    from .sync import SyncOptions, plan_sync, sync_tree

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))    # clusterctl/, above transfer/
    targets = _others(connector, lambda h: not h.local)
    if not targets.cluster.hosts:
        return None
    options = SyncOptions(dest=f"{LIB_DIR}/clusterctl", delete=True)
    return _check(sync_tree(targets, plan_sync(package, options), options), f"clusterctl (for {what})", hint)


def stage_data(connector: Connector, data_dir: str, *, reshard_into: str | None = None,
               all_shards: bool = False, progress: Progress | None = None) -> str:
    """Push the prepared shards (host i: its ranks' shards only; every shard with `all_shards`) and return the
    directory the ranks should read. On this machine alone nothing moves: the ranks read data_dir itself. With `reshard_into`
    (an elastic restart on another world size), shards prepared for another world are first cut again
    for this one into reshard_into/<the data directory's name> (data.shards.reshard)."""
    from ..data.shards import reshard
    from .shards import check_world, push_shards, read_manifest, remote_dir

    cluster = connector.cluster
    data_dir = os.path.abspath(data_dir)
    if reshard_into is not None and read_manifest(data_dir).world_size != cluster.world_size:
        target = os.path.join(reshard_into, os.path.basename(data_dir.rstrip("/")))
        reshard(data_dir, cluster.world_size, target)
        data_dir = target
    if all(h.local for h in cluster.hosts):
        check_world(data_dir, read_manifest(data_dir), cluster)     # as push_shards would, before launching
        return data_dir
    _check(push_shards(connector, data_dir, all_shards=all_shards, progress=progress), f"the shards of {data_dir}")
    # every rank works in its host's workdir, where push_shards put the data
    return os.path.relpath(remote_dir(cluster.hosts[0], os.path.basename(data_dir.rstrip("/"))),
                           cluster.hosts[0].workdir)


def fetch_run_dir(connector: Connector, run_id: str, local_dir: str, progress: Progress | None = None) -> tuple[int, int]:
    """After a run on other machines: copy what the job wrote into its run directory on the first host
    (<workdir>/runs/<id>/: the bundled trainer's metrics.jsonl and checkpoints) into the local run
    directory, so `clusterctl generate --checkpoint runs/<id>` works here. Names starting with "." (a
    checkpoint still being written, temporary files) are left out; every file lands atomically. Returns
    (files, bytes); (0, 0) when the job wrote nothing there. `progress(host, done, total)`: the bytes as they
    come, of the total the host listed before the copy."""
    host = connector.cluster.hosts[0]
    return fetch_tree(connector, host, connector.run_dir(host, run_id), local_dir, progress)


SAME_SIZE_KEPT = 64 * 2**10     # fetch_tree(growing=True): a file this big or bigger already here at its size is kept


def fetch_tree(connector: Connector, host, remote_dir: str, local_dir: str,
               progress: Progress | None = None, only: Callable[[str], bool] | None = None,
               growing: bool = False) -> tuple[int, int]:
    """Every file under remote_dir on `host` (names starting with "." left out; with `only`, those whose
    relative path it accepts) into local_dir, each landing atomically; (files, bytes). `growing`: the directory of
    a run that goes on, fetched again and again (a detached run's logs -f): a file of SAME_SIZE_KEPT bytes or more
    that is here at the size it has there is not fetched again (a log only grows, a checkpoint's files are
    written once under a new step's name); smaller ones (the JSON files rewritten in place) always are."""
    with connector.transport(host) as transport, transport.files() as session:
        got = _get_tree(session, remote_dir, local_dir,
                        (lambda done, total: progress(host.name, done, total)) if progress else None, only, growing)
    return len(got), sum(nbytes for _, nbytes in got)


def _kept(local_dir: str, rel: str, nbytes: int) -> bool:
    """Whether a file of a growing directory is here already as it is there (growing: fetch_tree)."""
    if nbytes < SAME_SIZE_KEPT:
        return False
    try:
        return os.path.getsize(os.path.join(local_dir, *rel.split("/"))) == nbytes
    except OSError:
        return False


def _get_tree(session, remote: str, local_dir: str, progress: Callable[[int, int], None] | None = None,
              only: Callable[[str], bool] | None = None, growing: bool = False) -> list[tuple[str, int]]:
    """Every file under `remote` (walk leaves out names starting with "."; `only` picks by relative path) into
    local_dir; [(relative path, bytes)]. `progress(done, total)`: the bytes so far, of the listed files' sizes.
    `growing`: fetch_tree's."""
    got = [(rel, nbytes) for rel, nbytes in session.walk(remote) if (only is None or only(rel))
           and not (growing and _kept(local_dir, rel, nbytes))]
    total, done = sum(nbytes for _, nbytes in got), 0

    def count(n: int) -> None:
        nonlocal done
        done += n
        progress(min(done, total), total)

    for rel, _ in got:
        target = os.path.join(local_dir, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if progress is None:
            session.get(f"{remote}/{rel}", target)
        else:
            session.get(f"{remote}/{rel}", target, on_bytes=count)
    if progress is not None:
        progress(total, total)
    return got


def spread_checkpoint(connector: Connector, run_id: str, step: str, holder, lacking: list, scratch: str,
                      timeout: float = 300.0) -> None:
    """Copy checkpoint `step` (step-000120) of run `run_id` from host `holder` to each host in `lacking`:
    hosts that were away while it was written and answer again at an elastic restart. Through this
    machine (hosts need not reach each other): into <workdir>/runs/<id>/checkpoints/.<step>.incoming/
    there, renamed into place and named `latest` only once every file is there, so a copy cut short is
    never resumed from. The holder's metrics.jsonl goes along, so a rank 0 that was away keeps writing
    one curve. Raises StageError naming every host that failed."""
    from ..hosts.fanout import run_all
    from ..hosts.quoting import quote_path

    local = os.path.join(scratch, step)
    with connector.transport(holder) as transport, transport.files() as session:
        root = connector.run_dir(holder, run_id)
        files = _get_tree(session, f"{root}/checkpoints/{step}", local)
        metrics = os.path.join(scratch, "metrics.jsonl")
        try:
            session.get(f"{root}/metrics.jsonl", metrics)
        except OSError:              # nothing reported yet
            metrics = None

    def push(host) -> None:
        root = connector.run_dir(host, run_id)
        incoming = f"{root}/checkpoints/.{step}.incoming"
        with connector.transport(host) as transport:
            transport.run(f"rm -rf {quote_path(incoming)}", timeout=60)
            with transport.files() as session:
                for name, _ in files:
                    session.makedirs(os.path.dirname(f"{incoming}/{name}"))
                    session.put(os.path.join(local, *name.split("/")), f"{incoming}/{name}")
                if metrics is not None:
                    session.put(metrics, f"{root}/metrics.jsonl")
            done = transport.run(f"cd {quote_path(root + '/checkpoints')} && rm -rf {step} && mv .{step}.incoming "
                                 f"{step} && echo {step} > .latest.tmp && mv .latest.tmp latest", timeout=60)
            if not done.ok:
                raise OSError(done.stderr.strip() or f"exit {done.exit_code}")

    _check(run_all(lacking, push, deadline=connector.deadline(timeout, slack=0)), f"checkpoint {step}",
           "the restart cannot continue from it there")
