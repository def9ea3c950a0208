"""The click group every command registers on, and the options several commands share (declared once)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import click

from ..errors import ClusterctlError
from ..hosts.transport import DEFAULT_CONNECT_TIMEOUT_S
from ..inventory_load import load_cluster
from ..launch import backends

if TYPE_CHECKING:
    from ..hosts.connector import Connector
    from ..inventory import Cluster

EXAMPLES: dict[str, str] = {}


class Failure(click.ClickException):
    """A ClusterctlError on its way out of click: one red `error: ...` line and the error's exit code,
    whether the command runs under main() or click's own runner."""

    def __init__(self, error: ClusterctlError):
        super().__init__(str(error))
        self.exit_code = error.exit_code

    def show(self, file=None) -> None:
        click.secho(f"error: {self.message}", fg="red", err=True)


# command -> the module of clusterctl.cli that defines it. A command's module is imported when the command
# is looked up (running it, or --help), so `clusterctl hosts` does not pay for importing `run` or `bench`.
MODULES = {"hosts": "hosts", "exec": "hosts", "init": "hosts", "ssh-close": "hosts", "doctor": "doctor", "hostfile": "launch",
           "run": "launch", "sync": "sync", "data": "data", "generate": "data", "export": "data", "bench": "bench",
           "runs": "observe", "logs": "observe", "plot": "observe", "ps": "observe", "kill": "observe",
           "completion": "observe", "stacks": "observe", "attach": "observe", "setup": "setup", "serve": "serve",
           "models": "models", "top": "top", "dashboard": "dashboard"}


class _Group(click.Group):
    """Lists every command with its one-line summary and an example; loads each command's module on first
    use; turns the core's errors into Failure (unless --debug, which lets the traceback through)."""

    @property
    def commands(self) -> dict[str, click.Command]:
        """Every command, each module loaded (what click's own machinery and tests read)."""
        for name in MODULES:
            self._load(name)
        return self._commands

    @commands.setter
    def commands(self, value) -> None:       # click.Group.__init__ sets it
        self._commands = value

    def _load(self, name: str) -> None:
        if name in MODULES and name not in self._commands:
            import importlib
            importlib.import_module(f"{__package__}.{MODULES[name]}")

    def add_command(self, cmd, name=None) -> None:
        self._commands[name or cmd.name] = cmd

    def get_command(self, ctx, name):
        self._load(name)
        return self._commands.get(name)

    def list_commands(self, ctx):
        return sorted(set(MODULES) | set(self._commands))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ClusterctlError as e:
            if (ctx.obj or {}).get("debug"):
                raise
            raise Failure(e) from e

    def format_commands(self, ctx, formatter):
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            rows.append((name, cmd.get_short_help_str(limit=70)))
            if name in EXAMPLES:
                rows.append(("", f"e.g. {EXAMPLES[name]}"))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(None, "--version", package_name="clusterctl", prog_name="clusterctl",
                      message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="Show Python tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx, debug):
    """clusterctl: turn a handful of Macs (and Linux boxes) into an MLX training cluster.

    Every command that talks to hosts takes --hosts INVENTORY (a YAML file; see docs/inventory.md).
    """
    ctx.obj = {"debug": debug}


def command(example: str, **kwargs):
    """Register a command (named after the function, without _cmd) with an example for --help."""
    def decorate(fn):
        name = fn.__name__.replace("_cmd", "").replace("_", "-")
        EXAMPLES[name] = example
        return cli.command(name=name, **kwargs)(fn)
    return decorate


class Seconds(click.ParamType):
    """A number of seconds, finite and at least `least` (more than it with `above`): what every S option takes.
    click's FloatRange lets nan and inf through (a comparison with nan is false), which a wait then trips on."""

    name = "seconds"

    def __init__(self, least: float = 0.0, above: bool = False):
        self.least, self.above = least, above

    def convert(self, value, param, ctx):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value}: give a finite number of seconds", param, ctx)
        if seconds < self.least or (self.above and seconds == self.least):
            self.fail(f"{value}: give {'more than' if self.above else 'at least'} {self.least:g} seconds", param, ctx)
        return seconds


hosts_option = click.option("--hosts", "inventory_path", required=True, type=click.Path(dir_okay=False),
                            metavar="INVENTORY", help="The inventory YAML file.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of a table.")
strict_host_keys_option = click.option("--strict-host-keys", is_flag=True,
                                       help="Refuse hosts whose key is not in known_hosts yet.")


def connect_timeout_option(default: float = DEFAULT_CONNECT_TIMEOUT_S):
    return click.option("--connect-timeout", type=Seconds(above=True), default=default, show_default=True, metavar="S",
                        help="Seconds to wait for an SSH connection.")


def detach_options(what: str, detach_help: str):
    """run's and serve's --detach, --supervisor and (hidden) --handoff: `what` a job is ("run", "server")."""
    def decorate(f):
        f = click.option("--handoff", "handoff_path", hidden=True, metavar="FILE",
                         help=f"A detached {what}'s supervisor: the {what} as handed over "
                              "(clusterctl/detach/handoff.py).")(f)
        f = click.option("--supervisor", "supervisor_host", metavar="HOST",
                         help="With --detach: the host the supervisor runs on (default: the first).")(f)
        return click.option("--detach", is_flag=True, help=detach_help)(f)
    return decorate


# a model's copy to the hosts' stores (models push, serve): how, and the way round the relay
PUSH_METHOD_HELP = ("auto: relayed from host to host where two or more hosts have a data-plane `address` "
                    "(docs/models.md#relay), else rsync over ssh where both ends have it, else SFTP; rsync or sftp: "
                    "to each host directly, that way.")
DIRECT_HELP = ("Copy the model to each host from this machine instead of once to the first host and from host to host "
               "over their data-plane addresses.")


def backend_option(benchmarked: bool = False):
    return click.option("--backend", type=click.Choice(backends.names(benchmarked)),
                        help="Default: the inventory's launch.backend.")


def host_key_policy(strict: bool) -> str | None:
    """--strict-host-keys as a policy: None keeps the inventory's."""
    return "strict" if strict else None


def connector(cluster: Cluster, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S, strict_host_keys: bool = False,
              *, lazy: bool = False) -> Connector:
    """The one Connector a command reaches its hosts with: --connect-timeout and --strict-host-keys on it."""
    from ..hosts.connector import Connector

    return Connector(cluster, host_key_policy(strict_host_keys), connect_timeout, lazy=lazy)


def load(inventory_path: str) -> Cluster:
    return load_cluster(inventory_path)
