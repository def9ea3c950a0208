"""clusterctl models [push | rm]: the model store on every host (transfer/models.py, docs/models.md)."""
from __future__ import annotations

import json
import sys

import click

from ..errors import EXIT_FAILED, EXIT_OK, UsageError
from ..hosts.scripts.contract import StoreState
from ..transfer.localmodel import DIGEST_SHOWN
from ..transfer.push import METHODS
from . import app
from .console import TransferProgress, one_line, size, table


@app.command("clusterctl models push ~/models/Qwen3-8B-4bit --hosts inventory.yaml", cls=click.Group,
             invoke_without_command=True)
@click.option("--hosts", "inventory_path", type=click.Path(dir_okay=False), metavar="INVENTORY",
              help="The inventory YAML file (lists every host's store).")
@app.connect_timeout_option()
@app.strict_host_keys_option
@app.json_option
@click.pass_context
def models_cmd(ctx, inventory_path, connect_timeout, strict_host_keys, as_json):
    """Models kept on every host by content: list them, push one, remove one.

    Without a subcommand: every host's store (name, digest, size, complete or partial).
    """
    if ctx.invoked_subcommand is not None:
        return
    if not inventory_path:
        raise UsageError("clusterctl models needs --hosts INVENTORY (or a subcommand: push, rm)")
    from ..transfer.models import list_models

    cluster = app.load(inventory_path)
    group = list_models(app.connector(cluster, connect_timeout, strict_host_keys))
    rows = []
    for o in group.values():
        if o.error is not None:
            rows.append({"host": o.host.name, "ok": False, "error": one_line(o.error), "entries": []})
            continue
        rows.append({"host": o.host.name, "ok": True, "error": None, "entries": [vars(m) for m in o.value]})
    if as_json:
        click.echo(json.dumps({"ok": group.all_ok, "hosts": rows}, indent=2))
    else:
        lines = []
        for r in rows:
            if r["error"]:
                lines.append({"host": r["host"], "name": "", "digest": "", "size": "", "state": f"error: {r['error']}",
                              "path": ""})
            for m in r["entries"]:
                state = m["state"] if m["state"] == StoreState.COMPLETE else f"{m['state']} ({size(m['bytes'])} so far)"
                if m["state"] == StoreState.COMPLETE and m["files"] < m["model_files"]:
                    state += f" ({m['files']} of {m['model_files']} files)"
                lines.append({"host": r["host"], "name": m["name"] or m["key"], "digest": (m["digest"] or "")[:DIGEST_SHOWN],
                              "size": size(m["size"]), "state": state, "path": m["path"]})
        if lines:
            table(lines, ["host", "name", "digest", "size", "state", "path"])
        else:
            click.echo("no models in any host's store")
    sys.exit(EXIT_OK if group.all_ok else EXIT_FAILED)


@models_cmd.command("push")
@click.argument("model_dir", metavar="MODEL_DIR")
@app.hosts_option
@click.option("--method", type=click.Choice(METHODS), default="auto", show_default=True, help=app.PUSH_METHOD_HELP)
@click.option("--direct", is_flag=True, help=app.DIRECT_HELP)
@click.option("--verify", is_flag=True, help="Re-hash every stored file on the hosts (finds damage that kept the "
              "file's size and mtime; reads the whole model on every host).")
@click.option("--bwlimit", type=click.IntRange(1), metavar="KBPS",
              help="Limit what this machine sends to KBPS KiB/s: to each host directly, to each relay chain's first.")
@app.connect_timeout_option()
@click.option("--timeout", type=app.Seconds(above=True), metavar="S", default=7200.0, show_default=True,
              help="Seconds a host's whole transfer may take.")
@app.strict_host_keys_option
@app.json_option
def models_push_cmd(model_dir, inventory_path, method, direct, verify, bwlimit, connect_timeout, timeout,
                    strict_host_keys, as_json):
    """Put MODEL_DIR (an mlx-lm model: config.json, *.safetensors; or a Hugging Face model id, ORG/NAME, from the
    hub's cache here, downloaded into it first if need be) into every host's store, verified by sha256 there; a
    model already there moves nothing, a cut-off push continues where it stopped."""
    from ..transfer.hub import resolve
    from ..transfer.models import describe, push

    cluster = app.load(inventory_path)
    model = describe(resolve(model_dir))
    copying = TransferProgress("push").start()       # stderr: a line per host (redrawn on a terminal)
    routes = []

    def told(route):
        routes.append(route)
        for line in route.lines():
            click.echo(f"push: {line}", err=True)

    try:
        group = push(app.connector(cluster, connect_timeout, strict_host_keys), None, model, method=method,
                     verify=verify, progress=copying.update, bwlimit_kbps=bwlimit, timeout=timeout, direct=direct,
                     on_route=told)
    finally:
        copying.close()
    rows = []
    for o in group.values():
        row = {"host": o.host.name, "ok": o.ok, "error": one_line(o.error) if o.error else None}
        if o.value is not None:
            row.update({k: v for k, v in vars(o.value).items() if k != "host"}, reused=o.value.reused,
                       elapsed_s=round(o.value.elapsed_s, 3))
        rows.append(row)
    if as_json:
        click.echo(json.dumps({"ok": group.all_ok, "model": model.name, "digest": model.digest, "size": model.size,
                               "route": [vars(r) for r in routes], "hosts": rows}, indent=2))
    else:
        click.echo(f"{model.key}: {len(model.files)} files, {size(model.size)}")
        table([{"host": r["host"], "moved": _moved(r), "time": f"{r['elapsed_s']:.1f}s" if "elapsed_s" in r else "",
                "note": f"error: {r['error']}" if r["error"] else r["path"]} for r in rows],
              ["host", "moved", "time", "note"])
        failed = len(group.failed)
        click.echo(f"{len(group) - failed} ok, {failed} failed", err=bool(failed))
    sys.exit(EXIT_OK if group.all_ok else EXIT_FAILED)


def _moved(r: dict) -> str:
    if r["error"]:
        return ""
    if r["reused"]:
        return "already there" + (f", {len(r['damaged'])} damaged" if r["damaged"] else "")
    parts = [f"{size(r['sent_bytes'])} sent ({len(r['sent_files'])} files, {r['method']})"]
    if r["resumed_bytes"]:
        parts.append(f"continued from {size(r['resumed_bytes'])} already there")
    if r["damaged"]:
        parts.append(f"resent damaged {', '.join(r['damaged'])}")
    return "; ".join(parts)


@models_cmd.command("rm")
@click.argument("which", metavar="NAME|DIGEST")
@app.hosts_option
@click.option("--force", is_flag=True, help="Remove a model a clusterctl run (a serve) uses: stop that run first, on "
              "every host, as `clusterctl kill` does.")
@app.connect_timeout_option()
@app.strict_host_keys_option
@app.json_option
def models_rm_cmd(which, inventory_path, force, connect_timeout, strict_host_keys, as_json):
    """Remove a model from every host's store, complete or partial. NAME|DIGEST: the model's name, its entry
    name (NAME-DIGEST12) or a digest prefix (4+ hex digits); one naming several models is refused, and so is a
    model a running job uses (unless --force) or a push is writing."""
    from ..observe.procs import kill_runs
    from ..transfer.models import remove

    cluster = app.load(inventory_path)
    group = remove(app.connector(cluster, connect_timeout, strict_host_keys), None, which,
                   stop=kill_runs if force else None)
    rows = [{"host": o.host.name, "ok": o.ok, "error": one_line(o.error) if o.error else None,
             "removed": o.value or []} for o in group.values()]
    if as_json:
        click.echo(json.dumps({"ok": group.all_ok, "hosts": rows}, indent=2))
    else:
        for r in rows:
            what = f"error: {r['error']}" if r["error"] else ", ".join(r["removed"]) or "not there"
            click.echo(f"{r['host']}: {'removed ' if r['removed'] else ''}{what}")
    sys.exit(EXIT_OK if group.all_ok else EXIT_FAILED)
