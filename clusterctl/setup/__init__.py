"""`clusterctl setup`: what a user would otherwise do by hand on every host before a first job: mesh.py
(passwordless SSH between every pair of hosts), python.py (this machine's Python and MLX on every host),
network.py (Thunderbolt addresses on Macs). Each runs a POSIX sh script of its own on every host at once, which
prints one line per fact, and `error TEXT` when it fails."""
from __future__ import annotations

from ..errors import EXIT_CONNECT, EXIT_FAILED, EXIT_OK, ConnectError
from ..hosts.fanout import run_all


def exit_code(ok: bool, hosts) -> int:
    """A setup's exit status: 0; 3 when a host could not be reached (hosts' `unreachable`); else 1."""
    if ok:
        return EXIT_OK
    return EXIT_CONNECT if any(h.unreachable for h in hosts) else EXIT_FAILED


def script_error(result) -> str | None:
    """A setup script's failure: its first `error TEXT` line, else its exit status and the end of its stderr;
    None when it succeeded."""
    errors = [line[6:] for line in result.stdout.splitlines() if line.startswith("error ")]
    if errors:
        return errors[0]
    if result.exit_code != 0:
        return f"exit {result.exit_code}: {(result.stderr.strip() or '?')[-300:]}"
    return None


def run_script(connector, hosts, text_for, timeout: float) -> dict[str, tuple[str, str | None, bool]]:
    """The script text_for(host) on every host at once: each host's (stdout, error or None, whether it could
    not be reached)."""
    def one(host):
        with connector.transport(host) as t:
            return t.run(text_for(host), timeout)

    out = {}
    for name, outcome in run_all(hosts, one, connector.deadline(timeout)).items():
        if outcome.error is None:
            out[name] = (outcome.value.stdout, script_error(outcome.value), False)
        else:
            out[name] = ("", str(outcome.error).removeprefix(f"{name}: "), isinstance(outcome.error, ConnectError))
    return out
