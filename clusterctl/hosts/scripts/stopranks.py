"""Ask one run's ranks on this host to stop with their work kept, and optionally wait for them to end (launch/stop.py):
`python -c PROGRAM FOLDER RUN_ID SIGNAL WAIT_S [RANK ...]`. FOLDER is <workdir>/.clusterctl/runs/<run id>, where
every rank's bootstrap keeps rank-N.pid (stackdump.py); SIGNAL is INT or TERM, sent to the rank's own process
(the python running its program), never to the shells, ssh or launcher around it, or NONE (only the wait, for
ranks asked before); RANKS, when given, are the
only ranks asked (those the launch placed on this host: hosts that share a disk see each other's pid files).
The bundled trainer takes the first signal as a request: it finishes its step, writes a checkpoint and exits
(train/stopping.py). Prints one JSON line: {"asked": [ranks signalled], "left": [ranks still alive after WAIT_S]}.
Standard library only."""
import os
import sys
import time

from .contract import STOP_SIGNALS, reply
from .rankpids import carries_run, live_ranks

POLL_S = 0.2


def main(argv):
    folder, run_id, name, wait_s = os.path.expanduser(argv[1]), argv[2], argv[3], float(argv[4])
    only = {int(r) for r in argv[5:]}
    signum = STOP_SIGNALS[name]
    asked = {}
    for rank, pid in sorted(live_ranks(folder, run_id).items()):
        if only and rank not in only:
            continue
        try:
            if signum is not None:
                os.kill(pid, signum)
            asked[rank] = pid
        except OSError:
            pass
    deadline = time.monotonic() + wait_s
    left = dict(asked)
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = {rank: pid for rank, pid in left.items() if carries_run(pid, run_id)}
    reply({"asked": sorted(asked), "left": sorted(left)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
