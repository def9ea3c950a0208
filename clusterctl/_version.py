"""clusterctl's version, the one place it is written: pyproject.toml reads it (setuptools' dynamic version),
and the package answers `clusterctl.__version__` from here without importlib.metadata (15 ms at every launch,
which writes it in the hostfile's header)."""
__version__ = "0.1.0"
