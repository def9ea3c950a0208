"""The exceptions the core raises. The CLI turns each into one line and an exit code.

Exit codes (documented in README.md):
    0  success
    1  a command ran and failed on at least one host (fan-out), or an unexpected internal error
    2  bad input: usage errors, malformed inventories, unknown hosts
    3  could not connect to a host (SSH)
"""
from __future__ import annotations

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CONNECT = 3


class ClusterctlError(Exception):
    """Base of every error clusterctl reports to a user as one line."""

    exit_code = EXIT_FAILED


class InventoryError(ClusterctlError):
    """A malformed inventory; carries the file and 1-based line so the message reads `file:line: what`."""

    exit_code = EXIT_USAGE

    def __init__(self, path: str, line: int | None, message: str):
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {message}")


class ConnectError(ClusterctlError):
    """SSH could not reach or log in to a host. `detail` is what the SSH layer said, unabridged."""

    exit_code = EXIT_CONNECT

    def __init__(self, host: str, detail: str):
        self.host = host
        self.detail = detail
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


# ---- data (clusterctl/data): every one is bad input for the command at hand, exit 2 ----------

class DataError(ClusterctlError):
    """A corpus, tokenizer or shard directory clusterctl cannot use."""

    exit_code = EXIT_USAGE


class SourceError(DataError):
    """A corpus source that is missing, empty, malformed or of an unknown kind."""


class TokenizerError(DataError):
    """A tokenizer that cannot be loaded (missing file, missing `tokenizers` package, changed file)."""


class ShardError(DataError):
    """A shard directory that does not match its manifest.json, or a request it cannot serve."""
