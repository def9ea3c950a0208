"""Run the bench worker on every rank over the real launcher, the way `clusterctl run` does.

    bench = Bench(Connector(cluster), backend="mpi")   # pre-flight: every host can import the worker
    result = bench.collectives(sizes, ops)         # {"world", "rows": [...]} with bandwidths
    p2p = bench.point_to_point(nbytes)             # {"hosts", "matrix"}

Each measurement is one launch (launch.job.prepare + launch.supervise.Supervisor, as `run` does): rank 0's result line is
read back from its log. Runs go to a temporary directory that is removed when they succeed and named in
the error when they fail. A launch that succeeded with not one line of rank 0's reaching this machine (Open MPI can
drop a rank's forwarded output whole: docs/facts/launchers.md#mpirun-exit-status) is measured once more, and said.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Callable

from ..errors import EXIT_INTERRUPTED, EXIT_TIMEOUT, BenchAborted, BenchError, UsageError, exit_for_signal
from ..hosts.connector import Connector
from ..inventory import Cluster
from ..launch import backends
from ..launch.job import prepare
from ..launch.launchers import choose_site
from ..launch.plan import LaunchPlan, discover, remember_plan
from ..launch.supervise import Settings, Supervisor
from ..transfer.stage import ship_clusterctl
from .report import collective_rows, p2p_matrix, p2p_pairs, parse_result

WORKER = "clusterctl.bench.worker"
BUDGET_S = 0.15          # timed seconds per size and implementation, beyond the warm-up op
MAX_ITERS = 20          # per timed loop; SAMPLES loops per size
START_TIMEOUT_S = 60.0
P2P_ITERS = 5


class OutputDropped(BenchError):
    """A launch that succeeded, with nothing of rank 0's output here (Bench.launch measures again)."""


class Bench:
    def __init__(self, connector: Connector, backend: str, deadline_s: float = 600.0, plan: LaunchPlan | None = None,
                 say: Callable[[str], None] = lambda text: None):
        if backend not in backends.names(benchmarked=True):
            raise BenchError(f"bench measures the {' and '.join(backends.names(benchmarked=True))} backends, "
                             f"not {backend!r}")
        cluster = connector.cluster
        self.cluster, self.backend, self.deadline_s = cluster, backend, deadline_s
        self.connector, self.say = connector, say
        if plan is None:
            # the worker is part of clusterctl: ship this clusterctl to the hosts, as `run` does for its modules
            ship_clusterctl(connector, "bench's worker", "check that every host answers: clusterctl doctor")
            plan = discover(self.connector, module=WORKER)   # names the host that cannot import the worker
            remember_plan(cluster, plan)
        self.plan = plan
        try:       # here, or the first host when the launcher is not installed here, as run does
            self.site = choose_site(cluster, backends.get(backend), "auto", self.connector)
        except UsageError as e:
            raise BenchError(str(e)) from None

    @property
    def rank_hosts(self) -> list[str]:
        return [h.name for h in self.cluster.hosts for _ in range(h.slots)]

    def collectives(self, sizes: list[int], ops: list[str], mpi4py: bool = True, *,
                    cluster: Cluster | None = None, if_include: str | None = None,
                    budget_s: float = BUDGET_S, max_iters: int = MAX_ITERS, deadline_s: float | None = None) -> dict:
        """Time `ops` at every size. `cluster` / `if_include` override the launch settings (for --tune)."""
        spec = {"backend": self.backend, "ops": ops, "sizes": sizes,
                "mpi4py": mpi4py and backends.get(self.backend).mpi4py_reference,
                "budget_s": budget_s, "max_iters": max_iters,
                "deadline_s": min(deadline_s or self.deadline_s, self.deadline_s)}
        result = self.launch(spec, cluster, if_include)
        return {"world": result["world"], "backend": self.backend, "rows": collective_rows(result)}

    def point_to_point(self, nbytes: int, iters: int = P2P_ITERS) -> dict:
        pairs = p2p_pairs(self.rank_hosts, backends.get(self.backend).neighbours_only)
        if not pairs:
            raise BenchError("--p2p needs at least two hosts")
        spec = {"backend": self.backend, "p2p": {"bytes": nbytes, "pairs": pairs, "iters": iters},
                "deadline_s": self.deadline_s}
        result = self.launch(spec)
        return {"backend": self.backend, "bytes": nbytes, **p2p_matrix(result, self.rank_hosts)}

    def launch(self, spec: dict, cluster: Cluster | None = None, if_include: str | None = None) -> dict:
        try:
            return self._launch(spec, cluster, if_include)
        except OutputDropped as dropped:
            self.say(f"bench: {dropped}; measuring again")
            return self._launch(spec, cluster, if_include, again=True)

    def _launch(self, spec: dict, cluster: Cluster | None, if_include: str | None, again: bool = False) -> dict:
        cluster = cluster or self.cluster
        plan = self.plan if if_include is None else dataclasses.replace(self.plan, if_include=if_include)
        runs_root = tempfile.mkdtemp(prefix="clusterctl-bench-")
        launch = prepare(cluster, plan, script="-m", args=[WORKER, json.dumps(spec, separators=(",", ":"))],
                         backend=backends.get(self.backend), runs_root=runs_root, site=self.site,
                         connector=self.connector)
        outcome = Supervisor(launch, self.connector, emit=lambda text, err: None,
                             settings=Settings(start_timeout=START_TIMEOUT_S)).run()
        if outcome.exit_code == EXIT_INTERRUPTED or outcome.exit_code > exit_for_signal(0) and outcome.failed_rank is None:
            shutil.rmtree(runs_root, ignore_errors=True)
            raise BenchAborted(outcome.reason, outcome.exit_code)
        if outcome.exit_code == EXIT_TIMEOUT:      # the worker's watchdog (or the start timeout)
            raise BenchError(f"no result within {spec['deadline_s']:g} s: the ranks hung and gave up "
                             f"({outcome.reason}); logs in {launch.run_dir}")
        if outcome.exit_code != 0:
            last = f" ({outcome.tail[-1].strip()})" if outcome.tail else ""
            raise BenchError(f"{outcome.reason}{last}; logs in {launch.run_dir}")
        with open(os.path.join(launch.run_dir, "rank-0.log"), encoding="utf-8", errors="replace") as f:
            text = f.read()
        if not text and not again:      # the launch succeeded, and nothing of rank 0's came: its output was dropped
            shutil.rmtree(runs_root, ignore_errors=True)
            raise OutputDropped("every rank exited 0, but not one line of rank 0's output reached this machine")
        try:
            result = parse_result(text)
        except BenchError as e:
            raise BenchError(f"{e}; logs in {launch.run_dir}") from None
        if result["world"] != cluster.world_size:
            raise BenchError(f"the ranks formed a world of {result['world']}, the inventory has "
                             f"{cluster.world_size}; logs in {launch.run_dir}")
        shutil.rmtree(runs_root, ignore_errors=True)
        return result
