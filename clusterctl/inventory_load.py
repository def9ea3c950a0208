"""An inventory read the way every command reads it: parsed and validated by inventory.py, then checked
against the launch backends' registry (launch/backends/: `launch.backend` a registered name, and what that
backend needs from the inventory, each at its line).

    cluster = load_cluster("inventory.yaml")      # InventoryError (exit 2) at file:line

Beside inventory.py but above launch/, so not a base module: the command layers (cli/, setup/) read
inventories through it; below them, code is handed a Cluster.
"""
from __future__ import annotations

from .inventory import Cluster, load
from .launch.backends import validated


def load_cluster(path: str) -> Cluster:
    """Read an inventory the way every command does: parsed, validated, its backend a registered one."""
    return validated(load(path))
