"""The contract between the controller and the programs it runs on hosts: every name, mark and word both sides
write, written once (tests/unit/test_host_contract.py holds both sides to it). A script takes what it needs with
`from .contract import ...`, which scripts.program inlines, so the host gets this text with the script; the
controller imports the same names, and runs a script only through hosts/hostscript.py: `PYTHON -c PROGRAM ARG...`,
each argument one quoted word, a request one JSON word (read_request), a secret in the environment (on stdin);
the answer is one JSON document, the last line of stdout (reply), an object's keys those of Answer.SHAPES.
Standard library only."""
import json
import os
import signal
import sys

# every process a run starts carries RUN_TOKEN + its run id (RUN_ID, launch/job.py) on its command line; spelled in
# two parts, so that a script's own command line, which carries this text, is no run's
RUN_TOKEN = "clusterctl-" + "run-"
RUN_ID = r"\d{8}-\d{6}-[0-9a-f]{6}"
TMP = ".clusterctl-tmp-"                # an atomic upload's temporary name: NAME.clusterctl-tmp-XXXXXXXX (hosts/files.py)
PARTS = ".clusterctl-partial"           # a model store's partial files: rsync's --partial-dir, where SFTP appends
TOKEN_ENV = "CLUSTERCTL_RELAY_TOKEN"    # relay.py: the push's token, in its environment (transfer/relay.py)
LINK = "link:"                          # filehelper.py: a symbolic link's "hash" is LINK + its target (transfer/)
UNRESOLVED = "UNRESOLVED"               # ports.py's "why" for an address the host cannot resolve (serve/)
READY = "ready"                         # stdinrelay.py's line once every rank's FIFO is made (launch/stdinrelay.py)
EVERY = "--every"                       # telemetry.py's first argument, then seconds: a sample every so often
STOP_SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "NONE": None}   # stopranks.py's SIGNAL (launch/stop.py)
SUPERVISOR_LOG = "supervisor.log"       # a detached run's folder (detach.py, follow.py; detach/): the supervisor's output
LIVE_FILE = ".live.json"                # there: the live panel's last snapshot
END_MARK = "\x1eclusterctl-supervisor-state "   # follow.py's lines: the supervisor's state once it ended
LIVE_MARK = "\x1eclusterctl-live "              # and the live panel's snapshot each time it changed
# a rank's environment as launch/ sets it and bootstrap.py (its piece envfiles.py) reads and removes it
HOST_ENV = "CLUSTERCTL_HOST_ENV"        # JSON: rank -> the values of its host's own `env` (None: unset)
RELAY_ENV = "CLUSTERCTL_STDIN_RELAY"    # the stdin relay's FIFO tag
COPY_GATE_ENV = "CLUSTERCTL_COPY_GATE"  # the copy's token: start once <workdir>/.clusterctl/copies/TOKEN is there
ENV_FILES_ENV = "CLUSTERCTL_ENV_FILES"  # JSON: variable -> the text of a private file it then names


class SupervisorState:
    """The "state" of follow.py's answer about a detached run's supervisor (detach/supervisor.py, detach/follow.py)."""
    RUNNING = "running"          # its process lives: "pid", and the live panel's "step", "total_steps" and "loss"
    ENDED = "ended"              # it wrote exit.json: "code" and "ended" (epoch seconds)
    LOST = "lost"                # gone without exit.json: its host restarted, or it was killed with its keeper
    UNKNOWN = "unknown"          # no such run folder on the host, or no answer from it
    UNREACHABLE = "unreachable"  # the controller's own: the host could not be asked
    OVER = (ENDED, LOST)         # no longer running: its run can come home


class StoreState:
    """The "state" of modelstore.py's answers about a model in a host's store (transfer/storepush.py, cli/models.py)."""
    COMPLETE = "complete"        # every file there and checked: nothing to send
    PARTIAL = "partial"          # a push began: the files still to send
    INCOMPLETE = "incomplete"    # a folder of the store's without its record (a push that never wrote one)


class Answer:
    """The keys of the JSON objects a script answers with (for stacks.py, each item of its list; for detach.py, also
    the exit.json that follow.py reads): the script writes no other, and the controller, where it reads an answer,
    reads no other (tests/unit/test_host_contract.py holds both sides to these)."""
    SHAPES = {
        "ports.py": ("port", "free", "why", "said"),
        "stopranks.py": ("asked", "left"),
        "follow.py": ("state", "code", "ended", "pid", "why", "step", "total_steps", "loss", "signalled"),
        "detach.py": ("pid", "error", "code", "ended"),
        "stacks.py": ("rank", "pid", "text", "error", "source", "kinds", "native", "native_error"),
    }


def read_request(arg):
    """A request: the JSON word itself, or @PATH of an uploaded JSON file (removed once read)."""
    if not arg.startswith("@"):
        return json.loads(arg)
    with open(os.path.expanduser(arg[1:])) as f:
        req = json.load(f)
    os.unlink(os.path.expanduser(arg[1:]))
    return req


def reply(value):
    """One JSON line on stdout: a script's answer (its last line), or one message of a script that streams."""
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()
