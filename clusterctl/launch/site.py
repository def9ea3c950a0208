"""Where a launcher runs: this machine, or the first host over SSH. One type for every step of it:
launchers.choose_site picks the machine, job.prepare fills in what the backend needs there (a directory
for the launch's files, that machine's ssh, whether it runs as root, the launcher's argv prefix), and the
backends read it to build the command line.

    site = LaunchSite.here(connector, launcher, "/tmp/launch")    # this machine, ready for backend.command
    site = LaunchSite.first_host(host, transport)                   # chosen; its facts are asked at launch
    site = site.ready(dir, ssh=..., as_root=..., launcher=..., ssh_options=("-F", config))
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..inventory import Host

if TYPE_CHECKING:
    from ..hosts.connector import Connector
    from ..hosts.transport import Transport


@dataclass(frozen=True)
class LaunchSite:
    """The machine a launcher runs on, as the backend needs to know it."""

    dir: str = ""                     # a directory there for the launch's files (hostfile, ssh shim)
    ssh: str | None = None            # that machine's OpenSSH client
    as_root: bool = False             # the launching user is root (mpirun refuses root without a flag)
    launcher: list[str] | None = None # the launcher's argv prefix there (see Backend.launcher_here/_on_host)
    ssh_options: tuple[str, ...] = () # what that machine's ssh is given: -F and its rendering (openssh.py)
    name: str = "this machine"        # for messages
    host: str | None = None           # the inventory name of that machine; None: this machine
    transport: Transport | None = field(default=None, compare=False, repr=False)   # the host's, over SSH

    @classmethod
    def here(cls, connector: Connector, launcher: list[str] | None, dir: str = "") -> LaunchSite:
        """This machine: its ssh, given clusterctl's rendering of the inventory with the connector's settings,
        and its user."""
        return cls(dir, shutil.which("ssh"), os.geteuid() == 0, launcher, tuple(connector.ssh_options()))

    @classmethod
    def first_host(cls, host: Host, transport: Transport) -> LaunchSite:
        """A host, reached through `transport`; what the backend needs there is asked when it launches."""
        return cls(name=host.name, host=host.name, transport=transport)

    def ready(self, dir: str, *, ssh: str | None, as_root: bool, launcher: list[str] | None,
              ssh_options: tuple[str, ...]) -> LaunchSite:
        """This site with what its machine reported, ready for backend.command."""
        return dataclasses.replace(self, dir=dir, ssh=ssh, as_root=as_root, launcher=launcher, ssh_options=ssh_options)
