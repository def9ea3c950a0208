"""clusterctl sync."""
from __future__ import annotations

import json
import sys

import click

from ..errors import EXIT_FAILED, EXIT_OK
from ..transfer.push import METHODS
from . import app
from .console import Bars, one_line, size, table


@app.command("clusterctl sync . --hosts inventory.yaml --exclude '*.ckpt'")
@click.argument("path", default=".")
@app.hosts_option
@click.option("--exclude", "excludes", multiple=True, metavar="PATTERN",
              help="Do not ship files matching PATTERN (gitignore syntax, relative to PATH; repeatable).")
@click.option("--delete", is_flag=True, help="Remove files on the hosts that PATH no longer has.")
@click.option("--dry-run", is_flag=True, help="Show what would move (and be deleted); move nothing.")
@click.option("--dest", metavar="DIR", help="Sync into DIR inside each host's workdir instead of the workdir.")
@click.option("--method", type=click.Choice(METHODS), default="auto", show_default=True,
              help="auto: rsync over ssh where both ends have it, else SFTP.")
@click.option("--checksum", is_flag=True,
              help="Compare content, not size and mtime: a touched but unchanged file is not sent.")
@click.option("--bwlimit", type=click.IntRange(1), metavar="KBPS", help="Limit each host's transfer to KBPS KiB/s.")
@app.connect_timeout_option()
@click.option("--timeout", type=app.Seconds(above=True), metavar="S", default=3600.0, show_default=True,
              help="Seconds a host's whole transfer may take.")
@app.strict_host_keys_option
@app.json_option
def sync_cmd(path, inventory_path, excludes, delete, dry_run, dest, method, checksum, bwlimit, connect_timeout,
             timeout, strict_host_keys, as_json):
    """Mirror a project directory into every host's workdir."""
    from ..transfer.sync import SyncOptions, plan_sync, sync_tree

    cluster = app.load(inventory_path)
    options = SyncOptions(excludes=tuple(excludes), delete=delete, dry_run=dry_run, dest=dest, method=method,
                          checksum=checksum, bwlimit_kbps=bwlimit, timeout=timeout)
    plan = plan_sync(path, options)
    bars = None if as_json else Bars.on_terminal(cluster.names, threshold=Bars.LARGE)
    # lazy: hosts that rsync reaches are never resolved for paramiko
    connector = app.connector(cluster, connect_timeout, strict_host_keys, lazy=True)
    group = sync_tree(connector, plan, options, progress=bars.update if bars else None)
    if bars:
        bars.close()
    rows = []
    for o in group.values():
        r = o.value
        row = {"host": o.host.name, "rank": o.host.rank, "ok": o.ok, "error": one_line(o.error) if o.error else None}
        if r is not None:
            row.update(method=r.method, dest=r.dest, files=len(r.moved), bytes=r.moved_bytes, wire_bytes=r.wire_bytes,
                       deleted=len(r.deleted), elapsed_s=round(r.elapsed_s, 3), note=r.note,
                       moved=r.moved, deleted_files=r.deleted)
        rows.append(row)
    if as_json:
        click.echo(json.dumps({"ok": group.all_ok, "root": plan.root, "selection": plan.selection,
                               "files": len(plan.entries), "dry_run": dry_run, "hosts": rows}, indent=2))
    else:
        verb = "would send" if dry_run else "sent"
        click.echo(f"{plan.root}: {len(plan.entries)} files, {size(plan.total_bytes)} "
                   f"(chosen by {'git' if plan.selection == 'git' else '.gitignore rules'})")
        for row in rows:
            if dry_run and row["ok"]:
                for f in row["moved"]:
                    click.echo(f"[{row['rank']} {row['host']}] {verb} {f}")
                for f in row["deleted_files"]:
                    click.echo(f"[{row['rank']} {row['host']}] would delete {f}")
        table([{"host": r["host"], "method": r.get("method", ""), "files": r.get("files", ""),
                "bytes": size(r["bytes"]) if "bytes" in r else "", "deleted": r.get("deleted", ""),
                "time": f"{r['elapsed_s']:.1f}s" if "elapsed_s" in r else "",
                "note": r["error"] and f"error: {r['error']}" or r.get("note", "")} for r in rows],
              ["host", "method", "files", "bytes", "deleted", "time", "note"])
        failed = len(group.failed)
        click.echo(f"{len(group) - failed} ok, {failed} failed" + (" (dry run: nothing moved)" if dry_run else ""),
                   err=bool(failed))
    sys.exit(EXIT_OK if group.all_ok else EXIT_FAILED)
