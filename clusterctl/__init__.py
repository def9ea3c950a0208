"""clusterctl: turn a handful of Macs (and Linux boxes) into an MLX training cluster."""


def __getattr__(name: str):
    # Looked up on demand: importlib.metadata costs tens of milliseconds at every start of the CLI (and of
    # every rank of the bundled trainer), and only --version needs it.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("clusterctl")
        except PackageNotFoundError:  # running from a source tree that was never installed
            return "0.0.0+source"
    if name == "report":     # `from clusterctl import report`: the live panel's metrics line (progress.py)
        from .progress import report
        return report
    raise AttributeError(name)
