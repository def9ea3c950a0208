"""Keep a Mac awake for as long as this rank lives (docs/facts/macos.md#caffeinate-keeps-ranks-awake); part of the
rank bootstrap (bootstrap.py). caffeinate(8) -i holds off idle sleep, -s system sleep (on AC power only), and
-w ends caffeinate when the rank's pid is gone, however it ends (kill -9 included), so nothing is left behind
without carrying the run id. A Mac is what `uname -s` calls Darwin, asked only when a caffeinate is on PATH
(the probe asks uname too). The decision is pure (caffeinate_argv): tests/unit/test_bootstrap.py."""


def caffeinate_argv(system, caffeinate, pid):
    if system != "Darwin" or not caffeinate:
        return None
    return [caffeinate, "-i", "-s", "-w", str(pid)]


def keep_awake(pid):
    """(the caffeinate process or None, why it could not start or None)."""
    import shutil
    import subprocess
    caffeinate = shutil.which("caffeinate")
    if caffeinate is None:
        return None, None
    quiet = subprocess.DEVNULL      # never the rank's pipes: its output must end when the rank does
    try:
        system = subprocess.run(["uname", "-s"], stdin=quiet, stdout=subprocess.PIPE, stderr=quiet,
                                text=True, timeout=10).stdout.strip()
        argv = caffeinate_argv(system, caffeinate, pid)
        return (subprocess.Popen(argv, stdin=quiet, stdout=quiet, stderr=quiet) if argv else None), None
    except (OSError, subprocess.SubprocessError) as e:
        return None, "clusterctl: could not start caffeinate, this Mac may sleep during the job: %s" % e


def let_sleep(proc):
    import subprocess
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:      # it would not end on TERM
        proc.kill()
        proc.wait()
