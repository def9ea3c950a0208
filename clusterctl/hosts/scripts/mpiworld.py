"""Under `mpirun -np 1`, finalise the MPI world MLX initialised but will not finalise; part of the rank bootstrap
(bootstrap.py). MLX 0.32 leaves an MPI world of one initialised, and mpirun then fails the job ("exiting
improperly"): docs/facts/mlx-distributed.md#mpi-world-of-one-not-finalized."""


def finalize_world_of_one():
    import os
    if os.environ.get("OMPI_COMM_WORLD_SIZE") != "1":
        return
    # through the libmpi MLX already loaded, never another (docs/facts/mlx-distributed.md#mlx-mpi-libname)
    import ctypes
    for name in (os.environ.get("MLX_MPI_LIBNAME"), "libmpi.so.40", "libmpi.so", "libmpi.40.dylib", "libmpi.dylib"):
        try:
            lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD) if name else None
        except OSError:
            continue
        if lib is not None:
            up, down = ctypes.c_int(0), ctypes.c_int(0)
            lib.MPI_Initialized(ctypes.byref(up))
            lib.MPI_Finalized(ctypes.byref(down))
            if up.value and not down.value:
                lib.MPI_Finalize()
            break
