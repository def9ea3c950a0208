"""The performance suite: run every benchmarks/bench_*.py, then refresh the summary in RESULTS.md.

    .venv/bin/python benchmarks/run_all.py               # everything, settings that fit in 15 minutes
    .venv/bin/python benchmarks/run_all.py --only bench_fsdp,bench_bench
    .venv/bin/python benchmarks/run_all.py --summary-only   # rewrite the summary from results/*.json

Benchmarks are found by glob, so a new bench_NAME.py joins the suite by existing. Each one runs in its
own process (QUICK_ARGS trims the slow ones' repeats; the others run with their defaults), prints its
table (passed through here), and writes results/NAME.json. RESULTS.md keeps its hand-written sections
(how each benchmark works, what the figures mean); this script rewrites only the block between the
SUMMARY markers at its top: the machine, the date, each benchmark's headline figures from its JSON,
and how long it took. Ratios there were measured side by side within one run of a benchmark; absolute
times are this machine's and say so.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_MD = os.path.join(HERE, "RESULTS.md")
BEGIN, END = "<!-- SUMMARY: written by benchmarks/run_all.py -->", "<!-- END SUMMARY -->"
# Fewer repeats than the benchmarks' defaults where those alone would take minutes; medians still.
QUICK_ARGS = {"bench_doctor": ["--repeat", "2"], "bench_launch": ["--repeat", "3"], "bench_bench": ["--repeat", "3"],
              "bench_balance": ["--repeat", "1"]}
TIMEOUT_S = 600


def discover(only: set[str] | None = None) -> list[str]:
    paths = sorted(glob.glob(os.path.join(HERE, "bench_*.py")))
    names = [os.path.basename(p)[:-3] for p in paths]
    if only:
        unknown = only - set(names)
        if unknown:
            raise SystemExit(f"run_all: no benchmark named {', '.join(sorted(unknown))} (have: {', '.join(names)})")
        names = [n for n in names if n in only]
    return names


def run(name: str) -> dict:
    argv = [sys.executable, os.path.join(HERE, f"{name}.py"), *QUICK_ARGS.get(name, [])]
    print(f"== {name}: {' '.join(argv[1:])}", flush=True)
    start = time.monotonic()
    try:
        code = subprocess.run(argv, cwd=os.path.dirname(HERE), timeout=TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    elapsed = time.monotonic() - start
    print(f"== {name}: {'ok' if code == 0 else f'FAILED ({code})'} in {elapsed:.0f} s", flush=True)
    return {"name": name, "ok": code == 0, "exit": code, "seconds": round(elapsed, 1),
            "args": QUICK_ARGS.get(name, [])}


# ---- headline figures per benchmark (from its results/*.json) -------------------------------------

def _doctor(r: dict) -> str:
    sizes = sorted(r["results"], key=int)
    small, big = r["results"][sizes[0]], r["results"][sizes[-1]]
    return (f"{sizes[-1]} hosts: {big['shallow']:.2f} s absolute, {big['shallow'] / big['raw']:.2f}x the raw "
            f"all-to-all ssh floor; {big['shallow'] / small['shallow']:.1f}x the time at {sizes[0]} hosts")


def _launch(r: dict) -> str:
    parts = [f"{b}: run {m['clusterctl run']:.2f} s abs., {m['clusterctl run'] / m['generated argv']:.2f}x the "
             f"generated launcher argv" for b, m in r["results"].items()]
    fixed = r.get("fixed_cost")
    if fixed:       # launch's fixed cost: seconds over the printed mpirun line
        over = fixed["over_printed_line"]
        parts.append(f"fixed cost over the printed mpirun line ({fixed['hosts']} hosts, 1 s program): run "
                     f"+{over['run']:.2f} s, --no-sync +{over['run --no-sync']:.2f} s")
    return f"{r.get('hosts', '?')} hosts; " + "; ".join(parts)


def _fsdp(r: dict) -> str:
    return "FSDP/DP params+state: " + ", ".join(f"{x['backend']} w{x['world']} {x['params_state_ratio']:.2f}"
                                                for x in r["results"]) + \
        "; peak: " + ", ".join(f"{x['peak_ratio']:.2f}" for x in r["results"])


def _bench(r: dict) -> str:
    size = r["bytes"] // 2**20
    return f"all_sum {size} MiB, MLX/mpi4py busbw: " + ", ".join(
        f"{h} hosts {m['ratio']:.2f} ({m['mlx']:.3f} vs {m['mpi4py']:.3f} GB/s abs.)" for h, m in r["results"].items())


def _sync(r: dict) -> str:
    q = r["ratios"]
    return (f"{r['files']} files to {r['hosts']} hosts vs {r['hosts']} parallel rsync -a: first sync "
            f"{q['first: cli / rsync']:.2f}x (in-process {q['first: core / rsync']:.2f}x), no-change re-sync "
            f"{q['again: cli / rsync']:.2f}x (in-process {q['again: core / rsync']:.2f}x)")


def _prepare(r: dict) -> str:
    return "tokens/s abs.: " + ", ".join(f"{x['source']} ({x['tokenizer']}) {x['tokens_per_s'] / 1e6:.1f} M"
                                          for x in r["rows"])


def _train(r: dict) -> str:
    mem = {m["world"]: m for m in r["memory"]}
    w1, w4 = mem[min(mem)], mem[max(mem)]
    avg = ", ".join(f"{a['backend']} {a['per_tensor_over_bucketed']:.2f}x" for a in r["averaging"])
    tps = ", ".join(f"w{t['world']} {t['tokens_per_s']:,.0f}" for t in r["throughput"])
    return (f"sharded loading, MLX peak per rank at world {w4['world']} vs {w1['world']}: "
            f"{w4['sharded_mlx_peak_mb'] / w1['sharded_mlx_peak_mb']:.2f}x; per-tensor / bucketed step time: {avg}; "
            f"tokens/s abs.: {tps}")


def _panel(r: dict) -> str:
    q = r["results"]
    return (f"trainer tokens/s with the live panel / --plain: {q['ratio']['median']:.3f} (pairs "
            f"{q['ratio']['pairs_min']:.3f}..{q['ratio']['pairs_max']:.3f}); clusterctl CPU "
            f"{q['panel']['clusterctl_cpu_s']:.2f} s vs {q['plain']['clusterctl_cpu_s']:.2f} s abs. "
            f"({q['plain']['wall_s']:.0f} s runs); {q['chatty']['lines']:,} output lines: "
            f"{q['chatty']['panel']['clusterctl_cpu_s']:.2f} s vs {q['chatty']['plain']['clusterctl_cpu_s']:.2f} s")


def _stall(r: dict) -> str:
    q = r["results"]
    s = q["stall"]
    return (f"trainer tokens/s with the stall watchdog / off: {q['ratio']['median']:.3f} (pairs "
            f"{q['ratio']['pairs_min']:.3f}..{q['ratio']['pairs_max']:.3f}); a stall under --stall-timeout "
            f"{s['timeout_s']:g}: diagnosed {s['to_diagnosis_s']:.2f} s after the last progress "
            f"({s['beyond_timeout_s']:.2f} s beyond it), exit {s['to_exit_s']:.2f} s; `stacks latest` "
            f"{q['stacks_s']['median']:.2f} s")


def _balance(r: dict) -> str:
    m, a = r["median"], r["auto_over_off"]
    best = f" (of the best split 11:5's: {r['auto_over_best']['median']:.3f})" if "auto_over_best" in r else ""
    if "best_over_off" in r:
        best += f"; best split / off {r['best_over_off']['median']:.2f}"
    return (f"2 hosts, one slowed 2x: trainer tokens/s --balance auto / off {a['median']:.2f} (pairs "
            f"{a['pairs_min']:.2f}..{a['pairs_max']:.2f}){best}; final loss {r['loss_auto_vs_off'] * 100:+.1f}%; shares "
            f"{m['auto']['shares']}; --check-sync 10 / 100: {r['check_sync_10_over_100']['median']:.3f}")


def _zero3(r: dict) -> str:
    parts = [f"{name}: peak zero3/dp {x['zero3_peak_over_dp']:.2f} (fsdp/dp {x['fsdp_peak_over_dp']:.2f}), "
             f"tok/s zero3/dp {x['zero3_tokens_over_dp']:.2f}, loss {x['zero3_loss_vs_dp'] * 100:+.1f}%"
             for name, x in r["ratios"].items()]
    return "; ".join(parts) + f"; memory estimate within {r['estimate_worst'] * 100:.0f}% of every peak"


def _finetune(r: dict) -> str:
    parts = [f"{backend} world 2, against mlx_lm lora --fine-tune-type full: tok/s " + ", ".join(
        f"{s} {x['tokens_over_mlx_lm']:.2f}x" for s, x in v.items()) + "; peak per rank " + ", ".join(
        f"{s} {x['peak_over_mlx_lm']:.2f}x" for s, x in v.items()) for backend, v in r["ratios"].items()]
    w4 = r["world4_ratios"]
    return "; ".join(parts) + (f"; ring world 4, parameter-dominated model: peak zero3/dp {w4['zero3_peak_over_dp']:.2f}, "
                               f"loss {w4['zero3_loss_vs_dp'] * 100:+.2f}%")


def _qlora(r: dict) -> str:
    text = "; ".join(f"{backend} world 2, LoRA on a 4-bit base, against mlx_lm lora: tok/s " + ", ".join(
        f"{s} {x['tokens_over_mlx_lm']:.2f}x" for s, x in v.items()) + "; peak per rank " + ", ".join(
        f"{s} {x['peak_over_mlx_lm']:.2f}x" for s, x in v.items()) for backend, v in r["ratios"].items())
    w4 = r.get("world4_ratios")
    return text + (f"; ring world 4, 16-block 4-bit base: peak zero3/dp {w4['zero3_peak_over_dp']:.2f}, tok/s zero3/dp "
                   f"{w4['zero3_tokens_over_dp']:.2f}, loss {w4['zero3_loss_vs_dp'] * 100:+.2f}%" if w4 else "")


def _qlora_gpu(r: dict) -> str:
    return f"{r['device']['gpu'].split(',')[0]}, one process, LoRA on a 4-bit base against mlx_lm lora: " + "; ".join(
        f"{size}: tok/s {x['tokens_over_mlx_lm']:.2f}x, peak {x['peak_over_mlx_lm']:.2f}x with "
        f"{x['tokens_per_step_over_mlx_lm']:.1f}x the tokens a step"
        for size, x in r["ratios"].items())


def _serve(r: dict) -> str:
    ready, push, gen = r["ready"], r["push"], r["generation"]
    return (f"ready cold {ready['cold']['after_serve_s']:.1f}s, warm {ready['warm']['after_serve_s']:.1f}s "
            f"({ready['warm_over_cold']:.2f}x); models push / rsync -a {push['models_push_over_rsync']:.2f}x wall; "
            f"generation {gen['one_host_tokens_per_s']:.0f} tok/s on 1 host, {gen['two_hosts_tokens_per_s']:.0f} on 2 "
            f"({gen['two_over_one']:.2f}x)")


def _relay(r: dict) -> str:
    q, s = r["ratios"], r["summary"]
    text = (f"models push, {r['hosts']} hosts, {r['model_bytes'] / 1e6:.0f} MB over a {r['rate_bytes_per_s'] / 1e6:.0f} MB/s "
            f"shared uplink (1 host {s['a']['wall_s']['median']:.1f} s abs.): ")
    if r["direct_flag"]:
        text += (f"relayed / 1 host time {q['c_over_a_time']:.2f} (goal <= 1.3), --direct / 1 host "
                 f"{q['b_over_a_time']:.2f}; bytes from here {q['c_bytes_over_model']:.2f}x the model relayed, "
                 f"{q['b_bytes_over_model']:.2f}x --direct")
    else:       # before `--direct` existed: b and c ran the same command
        text += (f"{r['hosts']} hosts / 1 host time {q['c_over_a_time']:.2f}, bytes from here "
                 f"{q['c_bytes_over_model']:.2f}x the model (no --direct: one command)")
    for mode, kill in (r.get("kill") or {}).items():     # hop: h2's relay process; host: h2 itself
        first, again = kill["first"], kill["again"]
        text += (f"; kill -9 of h2's {'relay hop' if mode == 'hop' else 'whole host'} mid-push: first command exit "
                 f"{first['exit']} ({first['sent_up_over_model']:.2f}x the model from here), again "
                 f"{'passed' if again['passed'] else 'FAILED'} ({again['sent_up'] / 1e6:.1f} MB from here)")
    return text


def _main_job(r: dict) -> str:
    s = r["summary"]
    return (f"the README's main job (bare `clusterctl run`, {s['steps']} steps): {s['wall_s']['min']:.0f} / "
            f"{s['wall_s']['median']:.0f} / {s['wall_s']['max']:.0f} s abs. (min / median / max of {r['repeat']}), loss "
            f"{s['first_loss']} -> {s['last_loss']}, held-out {s['held_out']}")


def _dashboard(r: dict) -> str:
    d, t = r["dashboard_over_alone"], r["top_over_alone"]
    return (f"trainer tokens/s, 2 hosts, with the dashboard open in chromium / alone: {d['median']:.3f} (pairs "
            f"{d['pairs_min']:.3f}..{d['pairs_max']:.3f}); with `top` running / alone: {t['median']:.3f} (pairs "
            f"{t['pairs_min']:.3f}..{t['pairs_max']:.3f})")


def _lora_speed(r: dict) -> str:
    return "; ".join(f"{name}: ours/mlx-lm tokens/s {x['ours_over_mlx_lm']:.2f}x at held-out "
                     f"{x['held_out_ours_over_mlx_lm']:.3f}x, grouped {x['ours_grouped_over_mlx_lm']:.2f}x at "
                     f"{x['held_out_ours_grouped_over_mlx_lm']:.3f}x" for name, x in r["results"].items())


def _lora_bound(r: dict) -> str:
    q = r["results"]["over_mlx_lm"]
    return (f"prompts trained, one process, tokens/s over mlx-lm's batches: ours {q['ours_random']:.3f}x, grouped "
            f"{q['ours_grouped']:.3f}x, the ceiling (no padding, per-record attention) {q['ceiling']:.3f}x")


def _storm(r: dict) -> str:
    def seconds(f):
        return "no attempt lost" if f["detection_s"] is None else f"{f['detection_s']:.1f} / {f['recovery_s']:.1f} s"
    f = r["final"]
    faults = "; ".join(f"{x['fault'].split(' (')[0]} {seconds(x)}" for x in r["faults"])
    return (f"6 faults through one run, detection / recovery abs.: {faults}; {r['restarts']} restarts; final loss "
            f"{f['storm']['loss']:.6f} {'=' if f['equal'] else '!='} undisturbed {f['undisturbed']['loss']:.6f}")


def _detach(r: dict) -> str:
    m = r["median_tokens_per_s"]
    back = r["returned_s"]
    return (f"tokens/s detached / attached {r['ratio']:.3f} (median {m['detached']:.0f} / {m['attached']:.0f}, "
            f"{r['repeat']} runs each, 3 hosts); final loss the same every run: {r['same_final_loss']}; "
            f"`run --detach` returned in {min(back):.1f}-{max(back):.1f} s abs.")


SUMMARIES = {"detach": _detach, "storm": _storm, "lora_speed": _lora_speed, "lora_bound": _lora_bound,
             "serve": _serve, "finetune": _finetune, "qlora": _qlora, "qlora_gpu": _qlora_gpu,
             "doctor": _doctor, "launch": _launch, "fsdp": _fsdp, "bench": _bench, "sync": _sync,
             "prepare": _prepare, "train": _train, "panel": _panel, "stall": _stall, "balance": _balance,
             "zero3": _zero3, "relay": _relay, "main_job": _main_job, "dashboard": _dashboard}


def _generic(r: dict) -> str:
    """Any other benchmark: its first numeric figures, by path (ratios first)."""
    leaves: list[tuple[str, float]] = []

    def walk(prefix: str, value) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, (int, float)):
            leaves.append((prefix, value))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, list):
            for i, v in enumerate(value[:4]):
                walk(f"{prefix}[{i}]", v)

    walk("", r.get("results", r))
    leaves.sort(key=lambda kv: "ratio" not in kv[0] and "speedup" not in kv[0])
    return ", ".join(f"{k} {v:.3g}" for k, v in leaves[:6]) or "(no figures)"


def headline(path: str) -> tuple[str, str, str]:
    """(benchmark, date of its figures, headline) for one results/*.json."""
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    name = record.get("benchmark") or os.path.basename(path)[:-5]
    try:
        text = SUMMARIES.get(name, _generic)(record)
    except (KeyError, IndexError, AttributeError, TypeError, ValueError, ZeroDivisionError) as e:
        text = f"(could not summarise: {type(e).__name__} {e}; see {os.path.basename(path)})"
    return name, str(record.get("date", "?"))[:10], text


def summary(runs: list[dict], total_s: float | None) -> str:
    lines = [BEGIN, "## Summary (latest figures)", ""]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines.append(f"Written {when} on {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, "
                 f"Python {platform.python_version()}. Reproduce: `.venv/bin/python benchmarks/run_all.py`"
                 + (f" (this run: {total_s / 60:.1f} minutes)." if total_s is not None else "."))
    lines += ["", "| benchmark | figures from | headline (ratios side by side in one run; \"abs.\" = absolute, "
                  "this machine) | suite run |", "|---|---|---|---|"]
    by_name = {r["name"]: r for r in runs}
    for path in sorted(glob.glob(os.path.join(HERE, "results", "*.json"))):
        name, date, text = headline(path)
        r = by_name.get(f"bench_{name}")
        status = "-" if r is None else (f"{r['seconds']:.0f} s" + ("" if r["ok"] else f", FAILED ({r['exit']})"))
        lines.append(f"| {name} | {date} | {text} | {status} |")
    missing = [r for r in runs if not r["ok"]]
    if missing:
        lines += ["", "Failed in this run (their rows above are older figures): "
                  + ", ".join(r["name"] for r in missing) + "."]
    lines += ["", "The sections below explain each benchmark; their tables are the figures recorded (and "
                  "discussed) on the date in each heading.", END]
    return "\n".join(lines)


def write_results_md(block: str) -> None:
    with open(RESULTS_MD, encoding="utf-8") as f:
        text = f.read()
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        # first time: the summary goes after the introduction (the first paragraph after the title)
        head, sep, rest = text.partition("\n## ")
        text = head.rstrip("\n") + "\n\n" + block + "\n" + ("\n" + sep.lstrip("\n") + rest if sep else "")
    tmp = RESULTS_MD + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, RESULTS_MD)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="Comma-separated benchmark names (bench_fsdp,...).")
    parser.add_argument("--summary-only", action="store_true", help="Run nothing; rewrite the summary.")
    args = parser.parse_args()
    runs, total = [], None
    if not args.summary_only:
        start = time.monotonic()
        names = discover(set(args.only.split(",")) if args.only else None)
        runs = [run(name) for name in names]
        total = time.monotonic() - start
        print(f"{'benchmark':<16} {'result':<10} {'seconds':>8}")
        for r in runs:
            print(f"{r['name']:<16} {'ok' if r['ok'] else 'FAILED':<10} {r['seconds']:>8.0f}")
        print(f"total {total / 60:.1f} minutes")
    write_results_md(summary(runs, total))
    print(f"wrote {os.path.relpath(RESULTS_MD)}")
    if any(not r["ok"] for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
