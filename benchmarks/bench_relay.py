"""`clusterctl models push` over a slow uplink: relayed through the hosts against a copy per host (issue: relay
distribution).

    .venv/bin/python benchmarks/bench_relay.py [--rate 25e6] [--size-mb 200] [--repeat 3] [--hosts 4]

The setting a relay is for: a laptop on Wi-Fi pushing a model to Macs that reach each other over a fast link.
Here, 4 loopback sshd hosts (tests/sshcluster.py, each with a private root on this disk: `persistent_roots`) and
tests/throttle.py, the documented stand-in for the laptop's Wi-Fi: every SSH connection this machine opens
to a host goes through one token bucket of `--rate` bytes/s shared by all of them (this machine -> hosts; the
other direction unlimited), counted per host. The hosts' own traffic (the inventory's `address:`, and host-to-host
SSH) does not pass through it and is not limited: the ssh_config the inventory names is read at the same path on
this machine (HostName 127.0.0.1, the host's throttle port) and on the hosts (each host's private root holds the
cluster's own ssh_config there: the hosts' real addresses).

A model directory of `--size-mb` MB (config.json and 4 *.safetensors of random bytes, what describe() accepts)
is pushed, each push into empty stores (a store path of its own, removed after), with a cold start (no SSH
master left from the case before), side by side in each repeat:
  a. to 1 host (an inventory of h1 only);
  b. to 4 hosts with `--direct` (a copy per host from here: about 4x a's time over the shared uplink);
  c. to 4 hosts relayed (the default): goal c/a wall time <= 1.3 and bytes leaving this machine = 1x the model.
Without `--direct` in `clusterctl models push --help` (before the relay landed) b and c run the same command.
  d. the relay hop killed: a relayed push to 4 hosts; once every host holds at least a third of the model (each
     host's .partial directory, read on this machine through its root's directory), kill -9 the relay process on
     h2 (under h2's sshd: `python -c <hosts/scripts/relay.py>`, or the model store helper's op `relay`; with no
     relay, the rsync server there), then the same command again;
  e. the relaying host killed: the same, but h2 itself is killed (its sshd and every session under it, SIGKILL:
     the host gone for the rest of the command) and brought back, holding what its disk held, once the first
     command has ended; then the same command again.
  In d and e the second command must exit 0 with every host's entry verified (`ok`, and the entry complete in
  each store), and send each host no more than what it did not hold after the first command (sent_bytes <= model
  size - bytes held + 1% and 1 MB for the protocol; held is measured on each host before the second command: the
  verified files and the partial copies, not a killed receiver's temporary file). The first command's own
  figures are kept too: a relay may finish the push itself, round again without the killed hop.
Wall time is the `clusterctl models push --json` command's; bytes this machine sent are the throttle's count.
Figures: min and median of the repeats; ratios of the medians. Writes benchmarks/results/relay.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from bench_zero3 import subset_inventory  # noqa: E402
from record import write_record  # noqa: E402
from throttle import Throttle, ssh_config_text  # noqa: E402

ENTRY = ".clusterctl-entry.json"            # hosts/scripts/modelstore.py's names
PARTS = ".clusterctl-partial"
PARTIAL = ".partial"
MB = 1e6


def make_model(root: str, size: int, files: int = 4) -> str:
    """config.json and `files` weight files of random bytes, `size` bytes in all (random: nothing compresses)."""
    os.makedirs(root)
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "note": "bench_relay: random bytes, not a model"}, f)
    each = size // files
    for i in range(files):
        with open(os.path.join(root, f"model-{i + 1:05d}-of-{files:05d}.safetensors"), "wb") as f:
            left = each
            while left:
                n = min(left, 8 << 20)
                f.write(os.urandom(n))
                left -= n
    return root


def provenance(cwd: str) -> dict:
    """Which clusterctl the pushes ran (from `cwd`, with this environment: PYTHONPATH may name another checkout),
    and this checkout's commit, with whether clusterctl/ had changes not committed."""
    r = subprocess.run([sys.executable, "-c", "import clusterctl; print(clusterctl.__file__)"], capture_output=True,
                       text=True, cwd=cwd)
    repo = os.path.dirname(HERE)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=repo).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "clusterctl"], capture_output=True, text=True,
                           cwd=repo).stdout.strip()
    return {"module": os.path.dirname(r.stdout.strip()), "head": head, "clusterctl_uncommitted": bool(dirty)}


def supports_direct(cwd: str) -> bool:
    """Whether the clusterctl the pushes run (from `cwd`, as they do) has `models push --direct`."""
    r = subprocess.run([sys.executable, "-m", "clusterctl", "models", "push", "--help"], capture_output=True, text=True,
                       cwd=cwd)
    return "--direct" in r.stdout


class Bench:
    def __init__(self, cluster, throttle: Throttle, model: str, tmp: str):
        from clusterctl.transfer.localmodel import describe
        self.cluster, self.throttle, self.model_dir, self.tmp = cluster, throttle, model, tmp
        self.model = describe(model)        # hashes it once, into this run's cache (XDG_CACHE_HOME)
        self.size = self.model.size
        self.config = os.path.join(str(cluster.host_root), "ssh_config")      # this machine's view: throttled
        self.runs = 0

    # ---- inventories and stores -------------------------------------------------------------------------------
    def inventory(self, hosts: int, store: str) -> str:
        text = self.cluster.inventory.read_text()
        if hosts < len(self.cluster.hosts):
            text = subset_inventory(text, hosts)
        text = text.replace("ssh_config: ssh_config\n", f"ssh_config: {json.dumps(self.config)}\n", 1)
        old = f"  model_store: {json.dumps(str(self.cluster.host_root / 'model-store'))}\n"
        assert old in text, text
        text = text.replace(old, f"  model_store: {json.dumps(f'{self.cluster.host_root}/{store}')}\n", 1)
        path = os.path.join(str(self.cluster.root), f"inventory-{store}.yaml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def store_on(self, index: int, store: str) -> str:
        """Host `index`'s store directory as seen from this machine (its private root is a directory here)."""
        return os.path.join(str(self.cluster.host(index).dir), "disk", store)

    def drop_store(self, store: str) -> None:
        for h in self.cluster.hosts:
            shutil.rmtree(self.store_on(h.index, store), ignore_errors=True)

    def complete(self, index: int, store: str) -> bool:
        return os.path.isfile(os.path.join(self.store_on(index, store), self.model.key, ENTRY))

    def partial_dirs(self, index: int, store: str) -> list[str]:
        base = os.path.join(self.store_on(index, store), PARTIAL)
        try:
            names = os.listdir(base)
        except OSError:
            return []
        return [os.path.join(base, n) for n in names if n.startswith(self.model.key + "@")
                and os.path.isdir(os.path.join(base, n))]

    def raw_bytes(self, index: int, store: str) -> int:
        """Every byte on the host for this model: complete entry, partial directories, temporary files."""
        if self.complete(index, store):
            return self.size
        return sum(os.path.getsize(os.path.join(d, f)) for top in self.partial_dirs(index, store)
                   for d, _, names in os.walk(top) for f in names if os.path.isfile(os.path.join(d, f)))

    def held(self, index: int, store: str) -> dict:
        """What a later push can keep: whole files (as large as the model's) and the unfinished copies in rsync's
        --partial-dir; a receiver's temporary file (.NAME.XXXXXX, removed by the next push) is counted apart."""
        if self.complete(index, store):
            return {"held": self.size, "complete": True, "raw": self.size}
        held = 0
        for top in self.partial_dirs(index, store):
            for f in self.model.files:
                p = os.path.join(top, f.path)
                q = os.path.join(os.path.dirname(p), PARTS, os.path.basename(p))
                if os.path.isfile(p) and os.path.getsize(p) == f.size:
                    held += f.size
                elif os.path.isfile(q):
                    held += min(os.path.getsize(q), f.size)
        return {"held": held, "complete": False, "raw": self.raw_bytes(index, store)}

    # ---- one push ----------------------------------------------------------------------------------------------
    def argv(self, inventory: str, direct: bool) -> list[str]:
        return [sys.executable, "-m", "clusterctl", "models", "push", self.model_dir, "--hosts", inventory, "--json",
                *(["--direct"] if direct else [])]

    def cold(self, inventory: str) -> None:
        """No SSH master left from before: every case opens its connections (through the throttle) itself."""
        from clusterctl.hosts.openssh import close_masters
        from clusterctl.inventory import load
        close_masters(load(inventory))
        self.throttle.reset()

    def push(self, inventory: str, direct: bool) -> dict:
        self.cold(inventory)
        began = time.monotonic()
        r = subprocess.run(self.argv(inventory, direct), cwd=self.tmp, capture_output=True, text=True, timeout=1800)
        return self.outcome(r.returncode, r.stdout, r.stderr, time.monotonic() - began)

    def outcome(self, code: int, stdout: str, stderr: str, wall: float) -> dict:
        counted = self.throttle.counters()
        try:
            doc = json.loads(stdout)
        except ValueError:
            raise SystemExit(f"models push printed no JSON (exit {code}):\n{stdout[-2000:]}\n{stderr[-3000:]}") from None
        hosts = {h["host"]: {k: h.get(k) for k in ("ok", "sent_bytes", "resumed_bytes", "method", "elapsed_s",
                                                     "error", "reused")} for h in doc["hosts"]}
        return {"exit": code, "ok": doc.get("ok"), "wall_s": round(wall, 3), "sent_up": counted["up"],
                "sent_up_over_model": round(counted["up"] / self.size, 4), "received_down": counted["down"],
                "up_per_host": {n: c["up"] for n, c in counted["hosts"].items() if c["up"]},
                "connections": sum(c["connections"] for c in counted["hosts"].values()),
                "throttle_cpu_s": counted["cpu_s"], "route": doc.get("route"), "hosts": hosts,
                "stderr_tail": stderr[-600:] if code else ""}

    def case(self, label: str, hosts: int, direct: bool) -> dict:
        self.runs += 1
        store = f"store-{label}-{self.runs}"
        inventory = self.inventory(hosts, store)
        out = self.push(inventory, direct)
        out["verified"] = all(self.complete(i, store) for i in range(1, hosts + 1))
        if out["exit"] != 0 or not out["ok"] or not out["verified"]:
            raise SystemExit(f"case {label}: push failed: {json.dumps(out, indent=2)}")
        self.drop_store(store)
        print(f"  {label}: {out['wall_s']:6.2f} s, {out['sent_up'] / MB:7.1f} MB left this machine "
              f"({out['sent_up_over_model']:.2f}x the model), throttle process CPU {out['throttle_cpu_s']:.2f} s, "
              f"methods {sorted({h['method'] for h in out['hosts'].values()})}", flush=True)
        return out

    # ---- d, e: the relaying host's hop killed, or the host itself; then the same command again ----------------------
    def kill_case(self, label: str, whole_host: bool, at: float = 1 / 3) -> dict:
        """A relayed push to every host; once each holds `at` of the model, on h2: kill -9 its relay hop (d), or
        the whole host (e: its sshd and every session, SIGKILL; back with what its disk held once the command has
        ended); then the same command again."""
        store = f"store-kill-{label}"
        inventory = self.inventory(len(self.cluster.hosts), store)
        self.cold(inventory)
        began = time.monotonic()
        proc = subprocess.Popen(self.argv(inventory, False), cwd=self.tmp, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        killed, at_kill = [], {}
        try:
            while proc.poll() is None and not killed:
                raw = {h.name: self.raw_bytes(h.index, store) for h in self.cluster.hosts}
                if min(raw.values()) >= at * self.size:
                    if whole_host:
                        pids = [self.cluster.host(2).pid] + self.cluster.session_pids(2)
                        self.cluster.stop_host(2)
                        killed = [{"pid": p, "what": "host h2 (its sshd and every session)"} for p in pids]
                    else:
                        killed = self.kill_relay(2)
                    at_kill = {"after_s": round(time.monotonic() - began, 2), "raw_bytes": raw}
                else:
                    time.sleep(0.05)
            stdout, stderr = proc.communicate(timeout=1800)
        finally:
            if proc.poll() is None:
                proc.kill()
            if whole_host and self.cluster.host(2).proc is None:
                self.cluster.start_host(2)           # a persistent root: back with what it held
        first = self.outcome(proc.returncode, stdout, stderr, time.monotonic() - began)
        if not killed:
            raise SystemExit(f"case {label}: the push ended before every host held {at:.0%} of the model: {first}")
        held = {h.name: self.held(h.index, store) for h in self.cluster.hosts}
        print(f"  {label}: killed {killed[0]['what']} (pids {[k['pid'] for k in killed]}) {at_kill['after_s']} s in; "
              f"first run exit {first['exit']} in {first['wall_s']:.2f} s, {first['sent_up'] / MB:.1f} MB left this "
              f"machine ({first['sent_up_over_model']:.2f}x the model), hosts ok "
              f"{[n for n, h in first['hosts'].items() if h['ok']]}, received (MB) "
              f"{ {n: round((h['sent_bytes'] or 0) / MB, 1) for n, h in first['hosts'].items()} }; held after it (MB): "
              f"{ {n: round(x['held'] / MB, 1) for n, x in held.items()} }", flush=True)
        again = self.push(inventory, False)
        again["verified"] = all(self.complete(h.index, store) for h in self.cluster.hosts)
        checks = {}
        for h in self.cluster.hosts:
            got = again["hosts"][h.name]
            need = self.size - held[h.name]["held"]
            sent = got["sent_bytes"] or 0
            checks[h.name] = {"held_before": held[h.name]["held"], "needed": need, "sent_bytes": sent,
                              "resumed_bytes": got["resumed_bytes"], "method": got["method"],
                              "nothing_resent": sent <= need + 0.01 * self.size + MB}
        again["per_host"] = checks
        again["passed"] = bool(again["exit"] == 0 and again["ok"] and again["verified"]
                               and all(c["nothing_resent"] for c in checks.values()))
        self.drop_store(store)
        print(f"  {label}: again: exit {again['exit']}, {again['wall_s']:.2f} s, {again['sent_up'] / MB:.1f} MB left "
              f"this machine, verified {again['verified']}; per host sent / needed (MB): "
              f"{ {n: '%.1f/%.1f' % (c['sent_bytes'] / MB, c['needed'] / MB) for n, c in checks.items()} }; "
              f"{'PASSED' if again['passed'] else 'FAILED'}", flush=True)
        return {"killed": killed, "at_kill": at_kill, "first": first, "held_after_first": held, "again": again}

    def kill_relay(self, index: int) -> list[dict]:
        """kill -9 the relay process(es) on host `index`: the model store helper run with the op `relay`; with none
        (before the relay landed), the rsync server processes receiving there."""
        procs = []
        for pid in self.cluster.session_pids(index):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            except OSError:
                continue
            procs.append((pid, argv))
        relay = [(pid, argv) for pid, argv in procs if is_relay(argv)]
        what = "the relay hop"
        if not relay:
            relay = [(pid, argv) for pid, argv in procs if argv and os.path.basename(argv[0]) == "rsync"
                     and "--server" in argv]
            what = "the rsync server (no relay process there)"
        if not relay:
            raise SystemExit(f"case d: nothing to kill on h{index}: {[' '.join(a)[:120] for _, a in procs]}")
        out = []
        for pid, argv in relay:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            out.append({"pid": pid, "what": what, "argv": [a if len(a) < 200 else a[:60] + "..." for a in argv]})
        return out


def _relay_program() -> str | None:
    try:
        from clusterctl.hosts.scripts import program
        return program("relay.py")
    except Exception:           # no such script (yet, or any more): the store helper's `relay` op is looked for
        return None


RELAY_PROGRAM = _relay_program()


def is_relay(argv: list[str]) -> bool:
    """Whether a host's process is a relay hop: `python -c <hosts/scripts/relay.py> REQUEST`, or the model store
    helper's op `relay` (`python -c <modelstore.py> relay REQUEST`). Only the program and the op are looked at:
    paths in a request may hold any word."""
    if "-c" not in argv[:3] or len(argv) < argv.index("-c") + 2:
        return False
    i = argv.index("-c")
    text, rest = argv[i + 1], argv[i + 2:]
    return (RELAY_PROGRAM is not None and text == RELAY_PROGRAM) or ("modelstore" in text and rest[:1] == ["relay"])


def summarise(label: str, runs: list[dict]) -> dict:
    walls = [r["wall_s"] for r in runs]
    return {"wall_s": {"min": min(walls), "median": statistics.median(walls), "all": walls},
            "sent_up": statistics.median(r["sent_up"] for r in runs),
            "sent_up_over_model": statistics.median(r["sent_up_over_model"] for r in runs),
            "throttle_cpu_s": statistics.median(r["throttle_cpu_s"] for r in runs),
            "methods": sorted({h["method"] for r in runs for h in r["hosts"].values()}),
            "route": runs[-1].get("route")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=25e6, help="this machine's uplink, bytes/s shared (25e6)")
    parser.add_argument("--size-mb", type=float, default=200, help="model size in MB (10^6 bytes)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--no-kill", action="store_true", help="skip cases d and e")
    args = parser.parse_args()
    from sshcluster import SSHCluster, unshare_works

    if not unshare_works():
        raise SystemExit("bench_relay needs unshare -m: each host's private root holds the unthrottled ssh_config "
                         "at the path where this machine's throttled one is")
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as tmp:
        direct = supports_direct(tmp)
        source = provenance(tmp)
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")       # the model's sha256s, ssh renderings: ours
        model = make_model(os.path.join(tmp, "model"), int(args.size_mb * MB))
        cluster = SSHCluster(os.path.join(tmp, "cluster"), args.hosts, persistent_roots=True).start()
        throttle = Throttle(args.rate).start()
        try:
            for h in cluster.hosts:
                throttle.add(h.name, (h.address, h.port))
            # the same path, two views: throttled here, the hosts' own addresses in each host's root
            (cluster.host_root / "ssh_config").write_text(ssh_config_text(cluster, throttle))
            for h in cluster.hosts:
                (h.dir / "disk" / "ssh_config").write_text(cluster.ssh_config.read_text())
            bench = Bench(cluster, throttle, model, tmp)
            print(f"model {bench.size / MB:.0f} MB ({len(bench.model.files)} files) to {args.hosts} hosts; this "
                  f"machine's uplink {args.rate / MB:.0f} MB/s shared (tests/throttle.py); `--direct` "
                  f"{'given to b' if direct else 'not there (before the relay landed): b and c run one command'}", flush=True)
            bench.case("warmup", 1, False)        # host keys recorded, helpers' first start
            cases: dict[str, list[dict]] = {"a": [], "b": [], "c": []}
            for k in range(args.repeat):
                print(f"repeat {k + 1}/{args.repeat}", flush=True)
                cases["a"].append(bench.case("a", 1, False))
                cases["b"].append(bench.case("b", args.hosts, direct))
                cases["c"].append(bench.case("c", args.hosts, False))
            kill = None if args.no_kill else {"hop": bench.kill_case("d", whole_host=False),
                                              "host": bench.kill_case("e", whole_host=True)}
        finally:
            throttle.stop()
            cluster.stop_all()

    s = {k: summarise(k, v) for k, v in cases.items()}
    med = {k: v["wall_s"]["median"] for k, v in s.items()}
    low = {k: v["wall_s"]["min"] for k, v in s.items()}
    ratios = {"c_over_a_time": med["c"] / med["a"], "b_over_a_time": med["b"] / med["a"],
              "c_over_a_time_min": low["c"] / low["a"], "b_over_a_time_min": low["b"] / low["a"],
              "c_bytes_over_model": s["c"]["sent_up_over_model"], "b_bytes_over_model": s["b"]["sent_up_over_model"],
              "a_bytes_over_model": s["a"]["sent_up_over_model"]}
    print(f"\nmodel {bench.size / MB:.0f} MB, uplink {args.rate / MB:.0f} MB/s, {args.repeat} repeats (min / median wall)")
    names = {"a": "1 host", "b": f"{args.hosts} hosts, --direct" if direct else f"{args.hosts} hosts (direct)",
             "c": f"{args.hosts} hosts, relayed" if direct else f"{args.hosts} hosts (no relay yet)"}
    for k, v in s.items():
        print(f"  {k}. {names[k]:<24} {v['wall_s']['min']:6.2f} / {v['wall_s']['median']:6.2f} s   "
              f"{v['sent_up'] / MB:7.1f} MB from here ({v['sent_up_over_model']:.2f}x)   "
              f"{v['wall_s']['median'] / med['a']:.2f}x a")
    print(f"  c/a time {ratios['c_over_a_time']:.2f} (goal <= 1.3; of the mins {ratios['c_over_a_time_min']:.2f}), b/a "
          f"{ratios['b_over_a_time']:.2f} ({ratios['b_over_a_time_min']:.2f}), c bytes / model "
          f"{ratios['c_bytes_over_model']:.3f} (goal 1.0)")
    for label, (mode, k) in zip("de", (kill or {}).items()):
        print(f"  {label}. kill -9 of h2's {'relay hop' if mode == 'hop' else 'whole host'} mid-push, then again: "
              f"{'passed' if k['again']['passed'] else 'FAILED'}; first run exit {k['first']['exit']}, "
              f"{k['first']['sent_up'] / MB:.1f} MB from here; again {k['again']['wall_s']:.2f} s, "
              f"{k['again']['sent_up'] / MB:.1f} MB from here")
    write_record("relay", hosts=args.hosts, rate_bytes_per_s=args.rate, model_bytes=bench.size,
                 model_files=len(bench.model.files), repeat=args.repeat, direct_flag=direct, clusterctl=source,
                 summary=s, ratios={k: round(v, 4) for k, v in ratios.items()}, kill=kill,
                 runs={k: [{x: r[x] for x in ("wall_s", "sent_up", "sent_up_over_model", "up_per_host", "connections",
                                              "throttle_cpu_s", "route", "hosts")} for r in v] for k, v in cases.items()})
    return 0 if kill is None or all(k["again"]["passed"] for k in kill.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
