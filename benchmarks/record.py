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
