"""Run by the probe with the host's python: its version and prefix, whether it is externally managed (PEP 668),
whether mlx (with mx.distributed) and mpi4py import, and mlx-lm's version when it is installed, as one JSON line.
Any failure is reported in the JSON, never raised."""
import json
import os
import platform
import sys


def externally_managed() -> bool:
    """PEP 668: a distribution's python (Homebrew's, Debian's) refuses `pip install` outside a venv when its
    stdlib directory holds EXTERNALLY-MANAGED; a venv never is."""
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        return False
    try:
        import sysconfig
        return os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
    except (KeyError, OSError, ValueError):     # an odd build without the path: not managed, pip will tell
        return False


def info() -> dict:
    d = {"python": platform.python_version(), "executable": sys.executable, "prefix": sys.prefix,
         "externally_managed": externally_managed()}
    try:
        import mlx.core as mx
        d["mlx"] = mx.__version__
        d["distributed"] = bool(mx.distributed.is_available())
    except Exception as e:  # noqa: BLE001 - whatever breaks the import is what the user needs to see
        d["mlx_error"] = type(e).__name__ + ": " + str(e)
    try:
        import mpi4py
        d["mpi4py"] = mpi4py.__version__
    except Exception as e:  # noqa: BLE001
        d["mpi4py_error"] = type(e).__name__ + ": " + str(e)
    try:        # its metadata, not an import: mlx-lm imports transformers, seconds the probe need not spend
        from importlib.metadata import version
        d["mlx_lm"] = version("mlx-lm")
    except ImportError:     # PackageNotFoundError is one: not installed here
        pass
    return d


if __name__ == "__main__":
    print(json.dumps(info()))
