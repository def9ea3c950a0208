"""clusterctl: turn a handful of Macs (and Linux boxes) into an MLX training cluster."""


def __getattr__(name: str):
    # Looked up on demand, from the one place it is written (pyproject.toml reads it there too): no
    # importlib.metadata, which costs tens of milliseconds at every start of the CLI and of every launch.
    if name == "__version__":
        from ._version import __version__
        return __version__
    if name == "report":     # `from clusterctl import report`: the live panel's metrics line (progress.py)
        from .progress import report
        return report
    raise AttributeError(name)
