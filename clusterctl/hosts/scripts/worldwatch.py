"""Report the world MLX forms, without forcing a backend or changing what the program gets; part of the rank
bootstrap (bootstrap.py). A one-shot sys.meta_path finder waits for `mlx.core` to be imported (a program that
never imports it pays nothing) and, once the extension is loaded, replaces `mlx.core.distributed.init` with a
wrapper that returns exactly the group MLX returned and calls report(size, backend asked) after the first call
that returns one. Patched before the import statement completes, so `mx.distributed.init(...)` and
`from mlx.core.distributed import init` both get the wrapper. Limits: docs/facts/mlx-distributed.md#world-check.
Another waits for `mpi4py.MPI`, whose import initialises MPI, and reports its world as (size, "mpi4py"): started
by anything but an MPI launcher, each rank's MPI is a world of one of its own, which the program would never
notice."""


def watch_world(report):
    import sys
    import threading

    def wrap(core):
        real = getattr(getattr(core, "distributed", None), "init", None)
        if real is None:
            return
        once = threading.Lock()

        def init(*args, **kwargs):
            group = real(*args, **kwargs)
            if once.acquire(blocking=False):
                report(group.size(), kwargs.get("backend", args[1] if len(args) > 1 else "any"))
            return group

        init.__name__ = init.__qualname__ = "init"
        init.__module__, init.__doc__, init.__wrapped__ = "mlx.core.distributed", real.__doc__, real
        core.distributed.init = init

    def mpi_world(mpi):
        try:
            size = mpi.COMM_WORLD.Get_size() if mpi.Is_initialized() else None
        except Exception:        # noqa: BLE001 - an MPI the program set up its own way: nothing to say
            size = None
        if size is not None:
            report(size, "mpi4py")

    class Finder:
        def __init__(self, wanted, then):
            self.wanted, self.then = wanted, then

        def find_spec(self, name, path=None, target=None):
            if name != self.wanted:
                return None
            sys.meta_path.remove(self)
            import importlib.util
            spec = importlib.util.find_spec(name)
            loader = getattr(spec, "loader", None)
            if loader is not None and hasattr(loader, "exec_module"):
                load = loader.exec_module      # this spec's own loader object: nothing else is touched

                def exec_module(module):
                    load(module)
                    self.then(module)
                loader.exec_module = exec_module
            return spec

    for wanted, then in (("mlx.core", wrap), ("mpi4py.MPI", mpi_world)):
        if wanted in sys.modules:
            then(sys.modules[wanted])
        else:
            sys.meta_path.insert(0, Finder(wanted, then))
