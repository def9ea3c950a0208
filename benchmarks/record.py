"""What every benchmark writes: benchmarks/results/NAME.json, with the date and the machine, atomically."""
from __future__ import annotations

import json
import os
import platform
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))


def write_record(name: str, **fields) -> str:
    record = {"benchmark": name, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
              "python": platform.python_version(), **fields}
    out = os.path.join(HERE, "results", f"{name}.json")
    with open(out + ".tmp", "w") as f:
        json.dump(record, f, indent=2)
    os.replace(out + ".tmp", out)
    print(f"wrote {os.path.relpath(out)}")
    return out


def run_trainer(inventory: str, backend: str, trainer_args: list[str], cwd: str | None = None) -> tuple[float, list[dict], dict]:
    """The bundled trainer on the inventory's hosts as users start it (`clusterctl run --plain`), in a fresh
    directory (`cwd`, kept, when given): (wall seconds, its metrics.jsonl records, its summary.json). A failed run
    stops the benchmark."""
    import contextlib
    import glob
    import subprocess
    import sys
    import tempfile
    import time

    with (tempfile.TemporaryDirectory() if cwd is None else contextlib.nullcontext(cwd)) as cwd:
        argv = [sys.executable, "-m", "clusterctl", "run", "--hosts", inventory, "--backend", backend, "--plain",
                "--", *trainer_args]
        began = time.monotonic()
        r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=1800)
        wall = time.monotonic() - began
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        [path] = glob.glob(os.path.join(cwd, "runs", "*", "metrics.jsonl"))
        records = [json.loads(line) for line in open(path) if line.strip()]
        with open(os.path.join(os.path.dirname(path), "summary.json")) as f:
            summary = json.load(f)
        return wall, records, summary
