"""Serving a model: `clusterctl serve` on the loopback sshd hosts (tests/sshcluster.py), as users start it.

    .venv/bin/python benchmarks/bench_serve.py [--layers 8] [--dim 512] [--tokens 64]

A llama made here (tests/lmfixture.py; 8 layers, dim 512, mlp 1408: ~105 MB of float32 weights), each host's
model store in its private root (a tmpfs).
  1. Time to ready, cold (the model pushed into empty stores) and warm (already in the stores): from the
     command to serve's `ready at` line, which comes when a one-token completion is answered; and from the
     ranks' start to it. On 2 hosts over ring.
  2. Push throughput: `clusterctl models push` of the model into empty stores on 2 hosts, against `rsync -a` of
     the same directory to the same 2 hosts at once (two rsync processes, over the same ssh_config): wall time
     and MB/s (model bytes x hosts / wall).
  3. Generation tokens/s through the endpoint (this machine's port carried over SSH): a 64-token completion
     (temperature 0; the count is the usage's completion_tokens, the model may stop early), the median of 3, at 1 host
     and at 2 hosts (tensor parallelism over ring). Both hosts share this machine's 2 cores: the 2-host figure
     says what the sharding costs here, not what a second Mac adds.
  4. Pipeline stages: a qwen2 of the same size in 8 weight files (mlx-lm pipelines qwen2), pushed to 2 hosts'
     empty stores whole (what tensor parallelism needs) and as `serve --pipeline` pushes it, each host only the
     files its stage reads (serve/check.py stage_files): bytes sent and wall time.
Writes benchmarks/results/serve.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from bench_zero3 import subset_inventory  # noqa: E402
from record import write_record  # noqa: E402

READY = re.compile(r"serve: ready at (http://\S+) \(model (\S+)\): answered a one-token completion ([0-9.]+)s after "
                   r"the ranks started, ([0-9.]+)s after serve did")


class Served:
    def __init__(self, inventory: str, model: str, port: int, cwd: str):
        self.began = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "clusterctl", "serve", model, "--hosts", inventory,
                                      "--backend", "ring", "--port", str(port)],
                                     cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:       # one line at a time: the readiness line is awaited while it runs
            self.lines.append(line.rstrip())

    def ready(self, timeout: float = 600) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = READY.search(line)
                if m:
                    return {"url": m.group(1), "model": m.group(2), "after_ranks_s": float(m.group(3)),
                            "after_serve_s": float(m.group(4)), "wall_s": time.monotonic() - self.began,
                            "moved_nothing": sum("has it already" in x for x in self.lines)}
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise SystemExit("serve did not get ready:\n" + "\n".join(self.lines[-40:]))

    def stop(self) -> None:
        # SIGTERM stops serve as Ctrl-C does; SIGINT would not reach it when this benchmark was started in the
        # background by a non-interactive shell (which starts it with SIGINT ignored)
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


def tokens_per_s(url: str, model: str, tokens: int, repeat: int = 3) -> float:
    rates = []
    for _ in range(repeat):
        body = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": tokens,
                           "temperature": 0.0}).encode()
        began = time.monotonic()
        request = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as answer:
            done = json.loads(answer.read())
        rates.append(done["usage"]["completion_tokens"] / (time.monotonic() - began))
    return statistics.median(rates)


def with_store(inventory_text: str, store: str) -> str:
    return inventory_text.replace("defaults:\n", f"defaults:\n  model_store: {json.dumps(store)}\n", 1)


def stage_push(cluster, inventory: str, tmp: str, args) -> dict:
    """Part 4: a pipelined model pushed whole, then by stage, each into empty stores."""
    import lmfixture
    from clusterctl.hosts.connector import Connector
    from clusterctl.inventory import load
    from clusterctl.serve.check import check_model, stage_files
    from clusterctl.transfer.models import describe, push, require_all

    model = str(lmfixture.make_model(os.path.join(tmp, "q"), "qwen2", layers=args.layers, dim=args.dim,
                                     mlp=int(args.dim * 2.75), files=8))
    local = describe(model)
    stages = stage_files(model, 2, check_model(model, world=2, pipeline=True).layers)
    out = {}
    for how, store, files in (("whole", "store-whole", None),
                              ("stages", "store-stages", {h.name: stages[i] for i, h in enumerate(cluster.hosts)})):
        path = os.path.join(os.path.dirname(inventory), f"inventory-{store}.yaml")
        with open(path, "w") as f:
            f.write(with_store(cluster.inventory.read_text(), f"{cluster.host_root}/{store}"))
        began = time.monotonic()
        entries = require_all(push(Connector(load(path)), None, local, files=files))
        out[how] = {"wall_s": time.monotonic() - began, "sent_bytes": sum(e.sent_bytes for e in entries.values()),
                    "files": {h: len(e.files) for h, e in entries.items()}}
        print(f"pipeline model ({local.size / 1e6:.1f} MB) pushed {how}: {out[how]['sent_bytes'] / 1e6:.1f} MB sent to "
              f"2 hosts in {out[how]['wall_s']:.2f}s", flush=True)
    out["stages_over_whole_bytes"] = out["stages"]["sent_bytes"] / out["whole"]["sent_bytes"]
    out["stages_over_whole_wall"] = out["stages"]["wall_s"] / out["whole"]["wall_s"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    import lmfixture
    from sshcluster import SSHCluster, free_port

    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        model = str(lmfixture.make_model(os.path.join(tmp, "m"), "llama", layers=args.layers, dim=args.dim,
                                         mlp=int(args.dim * 2.75)))
        nbytes = sum(os.path.getsize(os.path.join(model, f)) for f in os.listdir(model))
        cluster = SSHCluster(os.path.join(tmp, "cluster"), 2).start()
        try:
            base = cluster.inventory.read_text()
            inv = {}
            for name, text in (("two", base), ("one", subset_inventory(base, 1))):
                for store in ("serve", "push"):
                    path = cluster.inventory.with_name(f"inventory-{name}-{store}.yaml")    # beside its ssh_config
                    path.write_text(with_store(text, f"{cluster.host_root}/store-{store}"))
                    inv[name, store] = str(path)
            port = free_port("127.0.0.1")
            cold = Served(inv["two", "serve"], model, port, tmp)
            got_cold = cold.ready()
            cold.stop()
            warm = Served(inv["two", "serve"], model, port, tmp)
            got_warm = warm.ready()
            two_hosts = tokens_per_s(got_warm["url"], got_warm["model"], args.tokens)
            warm.stop()
            one = Served(inv["one", "serve"], model, port, tmp)
            got_one = one.ready()
            one_host = tokens_per_s(got_one["url"], got_one["model"], args.tokens)
            one.stop()
            print(f"ready: cold {got_cold['after_serve_s']:.1f}s from the command ({got_cold['after_ranks_s']:.1f}s from "
                  f"the ranks' start), warm {got_warm['after_serve_s']:.1f}s ({got_warm['after_ranks_s']:.1f}s); "
                  f"warm moved nothing on {got_warm['moved_nothing']} host(s)", flush=True)
            print(f"generation: {one_host:.1f} tok/s on 1 host, {two_hosts:.1f} tok/s on 2 hosts", flush=True)

            began = time.monotonic()
            r = subprocess.run([sys.executable, "-m", "clusterctl", "models", "push", model, "--hosts",
                                inv["two", "push"], "--json"], cwd=tmp, capture_output=True, text=True, timeout=1800)
            push_s = time.monotonic() - began
            if r.returncode != 0:
                raise SystemExit(r.stdout + r.stderr)
            pushed = json.loads(r.stdout)["hosts"]
            began = time.monotonic()
            copies = [subprocess.Popen(["rsync", "-a", "-e", f"ssh -F {cluster.ssh_config}", model + "/",
                                        f"{h.name}:{cluster.host_root}/rsync-copy/"]) for h in cluster.hosts]
            if any(c.wait(1800) for c in copies):
                raise SystemExit("rsync failed")
            rsync_s = time.monotonic() - began
            print(f"push of {nbytes / 1e6:.1f} MB to 2 hosts: models push {push_s:.2f}s "
                  f"({2 * nbytes / push_s / 1e6:.0f} MB/s), rsync -a {rsync_s:.2f}s ({2 * nbytes / rsync_s / 1e6:.0f} MB/s)",
                  flush=True)
            staged = stage_push(cluster, inv["two", "push"], tmp, args)
        finally:
            cluster.stop_all()
            shutil.rmtree(os.path.join(tmp, "runs"), ignore_errors=True)

    write_record("serve", model_bytes=nbytes, layers=args.layers, dim=args.dim, tokens=args.tokens,
                 ready={"cold": got_cold, "warm": got_warm,
                        "warm_over_cold": got_warm["after_serve_s"] / got_cold["after_serve_s"]},
                 push={"models_push_s": push_s, "rsync_s": rsync_s, "models_push_over_rsync": push_s / rsync_s,
                       "hosts": {h["host"]: {"sent_bytes": h["sent_bytes"], "method": h["method"]} for h in pushed}},
                 generation={"one_host_tokens_per_s": one_host, "two_hosts_tokens_per_s": two_hosts,
                             "two_over_one": two_hosts / one_host},
                 pipeline_push=staged)
    return 0


if __name__ == "__main__":
    sys.exit(main())
