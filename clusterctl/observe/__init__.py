"""Looking at runs: what `run` records about each run, and what `runs`, `logs`, `plot`, `ps` and `kill`
read back.

    record.py   what `run` writes: runs/<id>/summary.json at the end, runs/<id>/clusterctl.pid and
                log-times.jsonl while it runs, and one line per start and end in the runs index
                (~/.cache/clusterctl/runs.jsonl)
    runs.py     the runs of a directory (or of every project, from the index): id, start, duration, hosts,
                world, backend, outcome, final loss; `latest` and id prefixes
    logs.py     a run's rank logs, merged in time order or one rank; following a live run
    plot.py     metrics.jsonl as curves: a PNG / SVG (matplotlib, optional) or text in the terminal
    procs.py    the processes of clusterctl runs on every host (portable ps, parsed in a pure function);
                stopping them with the sweep `run` itself uses
    telemetry.py each host's memory, pressure, swap, load, GPU, heat, disk and ranks (`top`), sampled over
                connections kept open; swapping and throttled hosts flagged
    hostwatch.py a run's hosts sampled while it runs (the live panel's host rows); a host starting or
                stopping swapping or being throttled told once per change and kept in runs/<id>/hosts.jsonl
"""
