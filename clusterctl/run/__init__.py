"""`clusterctl run`, the use case, callable without click (usecase.py):

    stage -> plan / pre-flight -> launch site -> launch -> supervise -> fetch

    from clusterctl.run.options import RunOptions
    from clusterctl.run.usecase import run
    result = run(cluster_or_None, RunOptions(script="train.py", args=("--lr", "3e-4")), events)
    result.exit_code, result.outcome.reason, result.launch.run_dir

What the program needs (inputs, stdin, how it resumes, its checks, what it is, what it produces) its kind says
(program.py; the bundled trainer's is trainer_program.py): run never asks a program's name. How each attempt is
launched and watched is one AttemptSettings (launch/attempts.py), made by the caller and handed down as it is.

0. Ready (ready.py): the program (resolve.py: SCRIPT, -m MODULE or the bundled trainer, `--resume latest`, its
   model here, its inputs), the cluster (--env's words parsed by envflags.py), the backend's and the restart
   policy's refusals, the program's checks on the last plan; nothing has moved yet.
1. Stage (staging.py): copy the project (the current directory), clusterctl itself (for a clusterctl module such
   as the bundled trainer), each host's own dataset shards and the program's model (modelpush.py, which serve
   uses too) to the hosts, all at once (transfer/stage.py).
2. Plan: launch at once from the plan the last verified launch on this cluster used, while the pre-flight
   (every host reachable, with its python and the script or module in place) verifies it beside the
   starting job; with no cached plan, the pre-flight runs first (launch/plan.py).
3. Site: the launcher runs here when it is installed here, else on the first host (launch/launchers.py).
4. Attempts (launch/attempts.py): launch and supervise (launch/job.py, launch/supervise.py); when the
   pre-flight finds the hosts changed, the job is stopped and launched again from the fresh plan; with
   --max-restarts, a failed attempt is followed by the next. run feeds and hears them (hooks.py).
5. Fetch (fetch.py): what the job wrote in its run directory on the first host comes home (checkpoints, metrics;
   what its kind says it produced there is told), and every `--fetch PATH` from rank 0's host, or from every host
   (transfer/fetch.py), whatever the outcome.
6. Record: runs/<id>/summary.json (exit code, reason, times) and the runs index (observe/record.py), and,
   for the bundled trainer, runs/<id>/loss.png when matplotlib is installed (observe/plot.py).

While the job runs (step 4), the hosts' telemetry is sampled every few seconds (observe/hostwatch.py): for the
live panel, and to tell (events.host_flagged) and record (runs/<id>/hosts.jsonl) a host that starts or stops
swapping or being throttled.

Everything the user sees goes through a RunEvents object (events.py: the CLI prints it; tests record it). What a
caller asks is one RunOptions (options.py). detached.py is `run --detach`'s start: ready and staged here, then
handed to a supervisor on a host.
"""
