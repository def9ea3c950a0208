"""Doctor's findings: one row per check × host (× peer), and how they are shown."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

PASS, WARN, FAIL = "pass", "warn", "fail"
CLUSTER = "(cluster)"   # the `host` of a finding about the cluster as a whole


@dataclass(frozen=True)
class Finding:
    check: str            # e.g. "ssh", "ssh-mesh", "mlx", "mpi-smoke"
    host: str             # an inventory name, or CLUSTER
    status: str           # pass | warn | fail
    detail: str           # the evidence, one line
    fix: str | None = None
    peer: str | None = None


@dataclass
class Report:
    hosts: list[str]
    findings: list[Finding]
    elapsed_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)   # seconds per phase, for benchmarks

    @property
    def ok(self) -> bool:
        return not any(f.status == FAIL for f in self.findings)

    def count(self, status: str) -> int:
        return sum(f.status == status for f in self.findings)

    def summary(self) -> str:
        return f"{self.count(PASS)} passed, {self.count(WARN)} warnings, {self.count(FAIL)} failed"

    def to_json(self) -> str:
        return json.dumps({"ok": self.ok, "hosts": self.hosts,
                           "checks": [_finding_json(f) for f in self.findings],
                           "elapsed_s": round(self.elapsed_s, 3)}, indent=2)


def _finding_json(f: Finding) -> dict:
    d = asdict(f)
    return {k: d[k] for k in ("check", "host", "peer", "status", "detail", "fix")}


_COLOURS = {PASS: "\x1b[32m", WARN: "\x1b[33m", FAIL: "\x1b[31m"}
_RESET = "\x1b[0m"


def render_table(report: Report, colour: bool = False) -> str:
    """Findings grouped by check, in the order checks first appear; the fix under each problem; a
    pass/warn/fail matrix for the all-to-all checks; the summary line last."""
    lines: list[str] = []
    order: list[str] = []
    for f in report.findings:
        if f.check not in order:
            order.append(f.check)
    for check in order:
        rows = [f for f in report.findings if f.check == check]
        lines.append(check)
        if rows[0].peer is not None:
            lines.extend("  " + line for line in render_matrix(report.hosts, rows, colour))
            rows = [f for f in rows if f.status != PASS]
        for where, f in _collapse(rows):
            lines.append(f"  {_status(f.status, colour)}  {where:<24} {f.detail}")
            if f.fix and f.status != PASS:
                lines.append(f"        {'':<24} fix: {f.fix}")
    lines.append(report.summary() + f" ({report.elapsed_s:.1f}s)")
    return "\n".join(lines)


def _collapse(rows: list[Finding]) -> list[tuple[str, Finding]]:
    """Passing rows with the same detail on several hosts become one row naming them all."""
    out: list[tuple[str, Finding]] = []
    shared: dict[str, int] = {}
    for f in rows:
        where = f.host if f.peer is None else f"{f.host} -> {f.peer}"
        if f.status == PASS and f.peer is None and f.detail in shared:
            i = shared[f.detail]
            out[i] = (out[i][0] + "," + f.host, out[i][1])
            continue
        if f.status == PASS and f.peer is None:
            shared[f.detail] = len(out)
        out.append((where, f))
    return out


def render_matrix(hosts: list[str], rows: list[Finding], colour: bool = False) -> list[str]:
    """from\\to matrix of a pairwise check: `ok`, `WARN`, `FAIL`, `-` on the diagonal, `?` not checked."""
    cell = {(f.host, f.peer): f.status for f in rows}
    width = max(len(h) for h in hosts + ["from\\to"])
    out = ["from\\to".ljust(width) + " " + " ".join(h.ljust(max(4, len(h))) for h in hosts)]
    for src in hosts:
        cells = []
        for dst in hosts:
            status = cell.get((src, dst))
            text = "-" if src == dst else {"pass": "ok", "warn": "WARN", "fail": "FAIL"}.get(status, "?")
            padded = text.ljust(max(4, len(dst)))
            if colour and status in _COLOURS:
                padded = _COLOURS[status] + padded + _RESET
            cells.append(padded)
        out.append(src.ljust(width) + " " + " ".join(cells).rstrip())
    return out


def _status(status: str, colour: bool) -> str:
    text = status.upper().ljust(4)
    return f"{_COLOURS[status]}{text}{_RESET}" if colour else text
