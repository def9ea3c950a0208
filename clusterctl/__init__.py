"""clusterctl: turn a handful of Macs (and Linux boxes) into an MLX training cluster."""
from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("clusterctl")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
