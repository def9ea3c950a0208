"""clusterctl bench."""
from __future__ import annotations

import json

import click

from ..launch import backends
from . import app


@app.command("clusterctl bench --hosts inventory.yaml --backend mpi --sizes 1K..64M")
@app.hosts_option
@app.backend_option(benchmarked=True)
@click.option("--sizes", default="1K..64M", show_default=True,
              help="Message sizes: a range of powers of two (1K..1G), a list (1M,64M), or both.")
@click.option("--ops", default="all_sum,all_gather", show_default=True, help="Collectives to time.")
@click.option("--no-mpi4py", is_flag=True, help="Skip the raw mpi4py comparison (mpi backend).")
@click.option("--tune", is_flag=True, help="Try btl_tcp_links (mpi) or connections-per-ip (ring) in 1, 2, 4, 8 "
                                           "and the shared subnets (mpi); print the winner.")
@click.option("--write", is_flag=True, help="With --tune: store the winner in the inventory (nothing else changes).")
@click.option("--p2p", is_flag=True, help="Bandwidth between every pair of hosts (ring: between ring neighbours).")
@click.option("--p2p-size", default="16M", show_default=True, help="Message size of --p2p.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
@click.option("--png", "png", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also draw the result into FILE: bandwidth by message size, one line per collective and "
                   "implementation, or --p2p's matrix as a heat map (needs matplotlib: pip install matplotlib).")
@app.connect_timeout_option()
@click.option("--timeout", type=app.Seconds(above=True), metavar="S", default=600.0, show_default=True,
              help="Seconds one launch may take before its ranks give up.")
def bench_cmd(inventory_path, backend, sizes, ops, no_mpi4py, tune, write, p2p, p2p_size, as_json, png,
              connect_timeout, timeout):
    """Measure all_sum / all_gather bandwidth across the cluster."""
    from ..bench.measure import Bench
    from ..bench.report import parse_sizes, render_table

    op_list = _checked_flags(ops, tune, write, p2p, png)
    size_list = parse_sizes(sizes)
    if png:
        from ..figure import check
        check("bench --png")          # before anything is measured
    cluster = app.load(inventory_path)
    backend = backend or cluster.launch.backend
    measured = backends.names(benchmarked=True)
    if backend not in measured:
        raise click.UsageError(f"bench measures the {' and '.join(measured)} backends; pass --backend (the "
                               f"inventory says {backend})")
    bench = Bench(app.connector(cluster, connect_timeout), backend, deadline_s=timeout, say=_say)
    doc = {"inventory": cluster.path, "backend": backend, "world_size": cluster.world_size,
           "hosts": cluster.names}
    if p2p:
        _point_to_point(bench, doc, p2p_size, as_json, png)
        return
    if tune:
        _tune(bench, doc, size_list[-1], inventory_path, write, as_json)
        return
    _say(f"bench: {', '.join(op_list)} at {len(size_list)} sizes on {cluster.world_size} ranks over {backend}")
    doc.update(bench.collectives(size_list, op_list, mpi4py=not no_mpi4py))
    click.echo(json.dumps(doc, indent=2) if as_json else render_table(doc["rows"]), nl=as_json)
    _draw(doc, png)


def _checked_flags(ops: str, tune: bool, write: bool, p2p: bool, png: str | None) -> list[str]:
    """The flags that exclude or need each other refused in one line; --ops as a list."""
    if write and not tune:
        raise click.UsageError("--write stores what --tune found: give --tune too")
    if tune and p2p:
        raise click.UsageError("give --tune or --p2p, not both")
    if png and tune:
        raise click.UsageError("--png draws the bandwidth by size or --p2p's matrix, not --tune's trials")
    op_list = [o.strip() for o in ops.split(",") if o.strip()]
    unknown = [o for o in op_list if o not in ("all_sum", "all_gather")]
    if unknown or not op_list:
        raise click.UsageError(f"--ops: {', '.join(unknown) or '(none)'}: choose from all_sum, all_gather")
    return op_list


def _say(text: str) -> None:
    click.echo(text, err=True)


def _draw(doc: dict, png: str | None) -> None:
    """--png: the result drawn into its file."""
    if png:
        from ..bench.picture import write_png
        _say(f"wrote {write_png(doc, png)}")


def _point_to_point(bench, doc: dict, p2p_size: str, as_json: bool, png: str | None) -> None:
    """--p2p: the bandwidth between every pair of hosts, as a matrix (or JSON)."""
    from ..bench.report import parse_size, render_matrix

    _say(f"bench: point-to-point, {p2p_size} messages, {len(doc['hosts'])} hosts over {doc['backend']}")
    doc["p2p"] = bench.point_to_point(parse_size(p2p_size))
    click.echo(json.dumps(doc, indent=2) if as_json else render_matrix(doc["p2p"]), nl=as_json)
    _draw(doc, png)


def _tune(bench, doc: dict, nbytes: int, inventory_path: str, write: bool, as_json: bool) -> None:
    """--tune: each setting's all_sum of the largest size, the best said (and, with --write, stored)."""
    from ..bench.report import format_bytes
    from ..bench.tune import describe, store
    from ..bench.tune import tune as run_tune

    _say(f"bench --tune: all_sum of {format_bytes(nbytes)} on {doc['world_size']} ranks over {doc['backend']}")

    def progress(t) -> None:
        _say(f"  {describe(t.setting)}: " + (f"busbw {t.busbw_gbs:.3f} GB/s" if t.error is None
                                             else f"failed: {t.error}"))

    trials, best = run_tune(bench, nbytes, progress=progress)
    doc["tune"] = {"bytes": nbytes, "trials": [t.__dict__ for t in trials], "best": best.__dict__}
    changed = store(inventory_path, bench, best) if write else []
    doc["tune"]["written"] = changed
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(f"best: {describe(best.setting)}: busbw {best.busbw_gbs:.3f} GB/s "
                   f"({format_bytes(nbytes)} all_sum, {doc['world_size']} ranks)")
    if write:
        _say(f"wrote {', '.join(changed)} to {inventory_path}" if changed
             else f"{inventory_path} already holds the best setting; unchanged")
