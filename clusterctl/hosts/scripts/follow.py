"""A detached run's supervisor as seen on its host (clusterctl/detach/follow.py):

    python -c TEXT FOLDER state             one JSON line: {"state": "running"|"ended"|"lost", "code", "pid", ...;
                                            while running, "step", "total_steps" and "loss" of the live panel}
    python -c TEXT FOLDER follow OFFSET     FOLDER/supervisor.log from byte OFFSET, as it grows, until the
                                            supervisor has ended; then the state line, after END_MARK; and,
                                            between lines, FOLDER/.live.json (the live panel's snapshot,
                                            one line) after LIVE_MARK each time it changed
    python -c TEXT FOLDER stop              SIGTERM to the supervisor (it stops the ranks, with their
                                            checkpoint, as `run` does on SIGTERM); the state line

"lost": no exit.json, and the supervisor's pid is gone (or is another process now) and so is its keeper's
(keeper.pid): the host restarted, or the keeper was killed with it. A supervisor gone while its keeper lives has
just ended: the keeper is writing exit.json, which `state` waits for (ENDING_S at most). POSIX only.
"""
import json
import os
import signal
import sys
import time

from .contract import END_MARK, LIVE_FILE, LIVE_MARK, SUPERVISOR_LOG, SupervisorState, reply
from .proctime import start_time

POLL_S = 0.25
ENDING_S = 10.0         # how long a keeper that outlived its supervisor may take to write exit.json


def ended(folder):
    """The supervisor's end as the keeper recorded it (exit.json), or None."""
    try:
        with open(os.path.join(folder, "exit.json")) as f:
            done = json.load(f)
    except (OSError, ValueError):
        return None
    return {"state": SupervisorState.ENDED, "code": done.get("code"), "ended": done.get("ended")}


def recorded(folder, name):
    """(pid, start time or "") from FOLDER/NAME ("PID START"), or None."""
    try:
        with open(os.path.join(folder, name)) as f:
            pid_text, _, started = f.read().strip().partition(" ")
        return int(pid_text), started
    except (OSError, ValueError):
        return None


def alive(pid, started):
    now = start_time(pid)
    return now is not None and (not started or now == started)


def state(folder):
    done = ended(folder)
    if done is not None:
        return done
    supervisor = recorded(folder, "supervisor.pid")
    if supervisor is None:
        return {"state": SupervisorState.LOST if os.path.isdir(folder) else SupervisorState.UNKNOWN, "why": "no supervisor.pid"}
    if alive(*supervisor):
        return dict({"state": SupervisorState.RUNNING, "pid": supervisor[0]}, **progress(folder))
    # it has ended: its keeper, while it lives, is about to write exit.json (it reaps the supervisor first)
    keeper = recorded(folder, "keeper.pid")
    deadline = time.monotonic() + ENDING_S
    while True:
        done = ended(folder)
        if done is not None:
            return done
        if keeper is None or not alive(*keeper) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return ended(folder) or {"state": SupervisorState.LOST, "pid": supervisor[0],
                             "why": "its process is gone and it left no exit code"}


def progress(folder):
    """The step, steps and loss of the live panel's last snapshot ({} without one): what `runs` shows."""
    try:
        with open(os.path.join(folder, LIVE_FILE)) as f:
            doc = json.load(f)
        job = doc["job"]
        losses = [r["loss"] for r in doc["ranks"] if r.get("loss") is not None]
        return {"step": job.get("step"), "total_steps": job.get("total_steps"), "loss": losses[0] if losses else None}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def follow(folder, offset):
    path = os.path.join(folder, SUPERVISOR_LOG)
    out = sys.stdout.buffer
    while not os.path.exists(path):
        if state(folder)["state"] != SupervisorState.RUNNING:
            break
        time.sleep(POLL_S)
    last = b"\n"
    live = Live(os.path.join(folder, LIVE_FILE))
    with open(path, "rb") if os.path.exists(path) else open(os.devnull, "rb") as f:
        f.seek(offset)
        while True:
            chunk = f.read(65536)
            if chunk:
                out.write(chunk)
                out.flush()
                last = chunk[-1:]
                continue
            if last == b"\n":              # between lines: the panel's snapshot, when it changed
                live.send(out)
            now = state(folder)
            if now["state"] != SupervisorState.RUNNING:
                rest = f.read()
                if rest:
                    out.write(rest)
                    last = rest[-1:]
                out.write(("" if last == b"\n" else "\n").encode() + (END_MARK + json.dumps(now) + "\n").encode())
                out.flush()
                return 0
            time.sleep(POLL_S)


class Live:
    """The live panel's snapshot file, sent (one line, after LIVE_MARK) each time its modification time moved."""

    def __init__(self, path):
        self.path, self.sent = path, None

    def send(self, out):
        try:
            moved = os.stat(self.path).st_mtime_ns
            if moved == self.sent:
                return
            with open(self.path, "rb") as f:
                doc = f.read().strip()
        except OSError:
            return
        if doc and b"\n" not in doc:
            out.write(LIVE_MARK.encode() + doc + b"\n")
            out.flush()
        self.sent = moved


def stop(folder):
    now = state(folder)
    if now["state"] == SupervisorState.RUNNING:
        try:
            os.kill(now["pid"], signal.SIGTERM)
            now["signalled"] = True
        except OSError as e:
            now["why"] = "SIGTERM: %s" % e.strerror
    return now


def main(args):
    folder = os.path.expanduser(args[0])
    if args[1] in ("state", "stop"):
        reply(state(folder) if args[1] == "state" else stop(folder))
        return 0
    return follow(folder, int(args[2]) if len(args) > 2 else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
