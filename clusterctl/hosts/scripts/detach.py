"""Start a detached run's supervisor on this host and keep it (clusterctl/detach/supervisor.py):

    python -c TEXT FOLDER WORKDIR PYTHON ARG...      (the environment comes as every command's, on stdin)

Forks a keeper in a session of its own (no controlling terminal, SIGHUP ignored, stdin /dev/null), out of the
tree of the SSH command that started it, so that neither the command's watchdog nor a closed terminal stops it.
The keeper runs `PYTHON ARG...` in WORKDIR (PYTHONPATH's entries taken relative to it) with its output
appended to FOLDER/supervisor.log, writes its own pid to FOLDER/keeper.pid and the
supervisor's to FOLDER/supervisor.pid (each "PID START", START its start time as `ps -o lstart=` gives it, to tell
it from a later process of the same pid), waits for it, and writes FOLDER/exit.json ({"code", "ended"}: a
negative code is the signal that ended it). Between the supervisor's end and exit.json the keeper still lives:
follow.py reads that as "ending", not "lost". This command prints {"pid": PID} once the supervisor has started, or
{"error": ...}, and exits; POSIX only (macOS and Linux).
"""
import json
import os
import signal
import subprocess
import sys
import time

from .contract import SUPERVISOR_LOG
from .proctime import start_time


def write_json(path, value):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_pid(path, pid):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d %s\n" % (pid, start_time(pid) or ""))
    os.replace(tmp, path)


def keep(folder, workdir, argv, report):
    """The keeper: in its own session, the supervisor started, its pid told through `report` (a pipe)."""
    os.setsid()
    write_pid(os.path.join(folder, "keeper.pid"), os.getpid())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    log = os.open(os.path.join(folder, SUPERVISOR_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    env = dict(os.environ)
    if env.get("PYTHONPATH"):       # its entries relative to the workdir (or ~), absolute from here on
        env["PYTHONPATH"] = os.pathsep.join(os.path.join(workdir, os.path.expanduser(p))
                                            for p in env["PYTHONPATH"].split(os.pathsep))
    try:
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    except OSError as e:
        os.write(report, json.dumps({"error": "%s: %s" % (argv[0], e.strerror)}).encode())
        os.close(report)
        os._exit(1)
    write_pid(os.path.join(folder, "supervisor.pid"), proc.pid)
    os.write(report, json.dumps({"pid": proc.pid}).encode())
    os.close(report)
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:
            continue
    write_json(os.path.join(folder, "exit.json"), {"code": code, "ended": time.time()})
    os._exit(0)


def main(args):
    folder, workdir, argv = os.path.expanduser(args[0]), os.path.expanduser(args[1]), args[2:]
    os.makedirs(folder, mode=0o700, exist_ok=True)
    read, report = os.pipe()
    first = os.fork()
    if first == 0:                      # a child that leaves at once: the keeper's parent becomes init
        os.close(read)
        if os.fork() == 0:
            try:
                keep(folder, workdir, argv, report)
            finally:
                os._exit(1)
        os._exit(0)
    os.close(report)
    os.waitpid(first, 0)
    answer = b""
    while True:
        chunk = os.read(read, 4096)
        if not chunk:
            break
        answer += chunk
    print(answer.decode() or json.dumps({"error": "the keeper ended before the supervisor started"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
