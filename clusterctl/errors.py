"""Every exception clusterctl raises, and every exit code. The CLI turns a ClusterctlError into one line
and its `exit_code`; nothing else in clusterctl exits.

Exit codes (documented in README.md#exit-codes):
    0    success
    1    a command ran and failed on at least one host (fan-out, unreachable included), a job failed, or an
         internal error
    2    bad input: usage errors, malformed inventories, datasets, checkpoints, flags
    3    a command that needs every host could not connect to one (SSH)
    124  a job was stopped by its start or hang timeout
    125  a job was stopped because it stalled: no rank made progress for the stall timeout
    130  interrupted (Ctrl-C); 128 + N for another signal N
A job whose rank exits N (1 to 255) makes `clusterctl run` exit N.

This module imports nothing: the trainer and the data loader, which run on the hosts with the standard
library and mlx only, import it too.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CONNECT = 3
EXIT_TIMEOUT = 124
EXIT_STALLED = 125
EXIT_INTERRUPTED = 130

# What each code means, for the reference (docs/cli.md, written from this by cli/reference.py; README's table is
# checked against it): every code any command exits with
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "a command that reports each host's outcome failed, or could not connect, on at least one host "
                 "(`exec`, `sync`, `data push`, `models`, `ps`, `kill`), a check failed (`doctor`), run's copies or "
                 "pre-flight checks failed on a host it reached, a job failed (its world check, a launch), or an "
                 "internal error (its traceback in ~/.cache/clusterctl/debug.log)",
    EXIT_USAGE: "bad input, refused before anything started: a usage error, a malformed inventory "
                "(`inventory.yaml:LINE: what`), a dataset, checkpoint, model or flag that cannot be used",
    EXIT_CONNECT: "a command that needs every host (`run`, `serve`, `bench`, `setup`, `hostfile --print-command`) "
                  "could not connect to one over SSH, whichever step found it; `run --elastic MIN`: fewer than MIN "
                  "ranks on the hosts that answer",
    EXIT_TIMEOUT: "`run`: the job was stopped by `--start-timeout` or `--hang-timeout`",
    EXIT_STALLED: "`run`: the job was stopped because it stalled (no rank made progress for the stall timeout)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); 128 + N for another signal N (143: SIGTERM)",
}
# and `run` exits N (1 to 255) when a rank exits N


def exit_for_signal(signum: int) -> int:
    """The shell's convention for a process ended by signal N."""
    return 128 + signum


class ClusterctlError(Exception):
    """Base of every error clusterctl reports to a user as one line."""

    exit_code = EXIT_FAILED


class BadInput(ClusterctlError):
    """Base of the errors that mean: the input to the command at hand cannot be used (exit 2)."""

    exit_code = EXIT_USAGE


# ---- inventories, templates, usage ------------------------------------------------------------

class InventoryError(BadInput):
    """A malformed inventory; carries the file and 1-based line so the message reads `file:line: what`."""

    def __init__(self, path: str, line: int | None, message: str):
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {message}")


class TemplateError(BadInput):
    """A hostfile template with a placeholder we have no value for, or that renders to bad JSON."""


class UsageError(BadInput):
    """A combination of options or arguments the core refuses (the CLI shows it like click's own)."""


class MissingExtra(BadInput):
    """An optional dependency the command needs is not installed; the message names the pip line."""


# ---- reaching hosts ---------------------------------------------------------------------------

class ConnectError(ClusterctlError):
    """SSH could not reach or log in to a host. `detail` is what the SSH layer said, unabridged; `reason`
    is a stable word for code to act on (see hosts.ssh.CONNECT_REASONS), never parsed from text."""

    exit_code = EXIT_CONNECT

    def __init__(self, host: str, detail: str, reason: str = "other"):
        self.host = host
        self.detail = detail
        self.reason = reason
        super().__init__(f"{host}: {detail}")


class CommandTimeout(ClusterctlError):
    """A remote or local command outlived its timeout; it was killed. Partial output is kept."""

    def __init__(self, host: str, command: str, timeout: float, stdout: str = "", stderr: str = ""):
        self.host = host
        self.command = command
        self.timeout = timeout
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(f"{host}: command timed out after {timeout:g}s and was killed: {command}")


class CommandFailed(ClusterctlError):
    """A command we needed to succeed exited non-zero."""

    def __init__(self, host: str, command: str, result):
        self.host = host
        self.command = command
        self.result = result
        tail = (result.stderr or result.stdout).strip().splitlines()
        why = f": {tail[-1]}" if tail else ""
        super().__init__(f"{host}: `{command}` exited {result.exit_code}{why}")


class DeadlineExceeded(ClusterctlError):
    """A host's part of a fan-out did not finish within the fan-out's deadline."""

    def __init__(self, host: str, deadline: float):
        self.host = host
        super().__init__(f"{host}: no result within the {deadline:g}s deadline")


# ---- moving files -----------------------------------------------------------------------------

class SyncError(BadInput):
    """Bad sync options (a --dest outside the workdir, an unknown method, no rsync for --method rsync)."""


class SyncSourceError(BadInput):
    """A project directory sync cannot read (missing, not a directory, git failing)."""


class RsyncMissing(ClusterctlError):
    """The host has no rsync on its non-interactive PATH (the caller falls back to SFTP)."""


class RsyncFailed(ClusterctlError):
    def __init__(self, host: str, code: int, stderr: str):
        self.host, self.code, self.stderr = host, code, stderr
        lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
        # rsync's own last line ("rsync error: some files/attrs were not transferred (see previous errors)")
        # names no cause: the lines before it do
        causes = [ln for ln in lines if not ln.startswith("rsync error:")]
        said = "; ".join(dict.fromkeys(causes[:2])) if causes else (lines[-1] if lines else "no message")
        super().__init__(f"{host}: rsync exited {code}: {said}")


class StageError(ClusterctlError):
    """Copying the project, clusterctl or the data to some host before a run failed (exit 1; 3 when every host it
    failed on could not be reached, as the pre-flight says it)."""


class NotOnHosts(BadInput):
    """A path the program reads that run does not copy is missing on some hosts (the bundled trainer's --model
    outside the project): named before anything is copied or started (exit 2)."""


# ---- data (clusterctl/data, data push): bad input for the command at hand, exit 2 ---------------

class DataError(BadInput):
    """A corpus, tokenizer or shard directory clusterctl cannot use."""


class SourceError(DataError):
    """A corpus source that is missing, empty, malformed or of an unknown kind."""


class TokenizerError(DataError):
    """A tokenizer that cannot be loaded (missing file, missing `tokenizers` package, changed file)."""


class ShardError(DataError):
    """A shard directory that does not match its manifest.json, or a request it cannot serve."""


class ShardVerifyError(ClusterctlError):
    """A file's sha256 on the host is not the manifest's after the transfer (exit 1)."""


class ModelError(DataError):
    """A directory that is not an mlx-lm model (for `serve`: one mlx-lm cannot load or shard as asked), or a NAME /
    digest prefix that names no model or several."""


class ModelStoreError(ClusterctlError):
    """A model file that still does not match its sha256 on the host after being sent again, or a host that
    did not get its entry (exit 1)."""


class ModelInUse(ModelStoreError):
    """`models rm` of a model a host still uses: a process there names its entry (a serve rank), or a push is
    writing it (exit 1)."""


# ---- launching and running jobs ---------------------------------------------------------------

class LaunchError(ClusterctlError):
    """The launch cannot be built here (no launcher installed, no ssh client on the launching host)."""


class PortTaken(BadInput):
    """A port `serve` would listen on is in use (on this machine, or on the host given to --listen)."""


class ServeError(ClusterctlError):
    """`serve` cannot go on: a host cannot give rank 0 a port, the server could not start (exit 1)."""


class PreflightError(ClusterctlError):
    """A host is not ready for the launch: python, the script or the module is missing there (exit 1)."""


class RestartError(ClusterctlError):
    """A restart (run --max-restarts) cannot go on: too few hosts answer for --elastic."""

    exit_code = EXIT_CONNECT


class SignalReceived(Exception):
    """SIGTERM or SIGHUP reached `run`: raised in the main thread to stop the job like Ctrl-C does.
    Not a ClusterctlError: it is caught by the supervisor, never shown as an error."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


# ---- the bundled trainer (runs on the hosts) ----------------------------------------------------

class ConfigError(BadInput):
    """A bad trainer flag, config file or combination of settings."""


class CheckpointError(BadInput):
    """A checkpoint that cannot be found, read, or resumed with these settings."""


class NoSpace(ClusterctlError):
    """A write that failed for want of space on a host (a checkpoint): exit 1, and `run` does not restart it."""


class DestinationRefused(BadInput):
    """A directory a command would replace whole that it cannot prove it wrote (no marker of its own), or one
    that is, or holds, what must survive it: the current directory, the run, the model it was made from."""


class WorldSizeMismatch(ClusterctlError):
    """MLX's distributed group does not have the size the launcher started."""


# ---- bench --------------------------------------------------------------------------------------

class BenchError(ClusterctlError):
    """A benchmark could not run or its ranks did not report (exit 1)."""


class BenchAborted(BenchError):
    """The user stopped the launch (Ctrl-C, SIGTERM): no further launch may start."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class SizesError(BenchError):
    """A --sizes or --p2p-size value that is not a size."""

    exit_code = EXIT_USAGE
