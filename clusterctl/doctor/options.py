"""What `clusterctl doctor` can be asked to do (its defaults are the CLI's)."""
from __future__ import annotations

from dataclasses import dataclass

# doctor's own connect timeout, shorter than the hosts layer's default: a diagnosis should not wait long
# for a host that does not answer (its Connector carries it, with the host-key policy)
DOCTOR_CONNECT_TIMEOUT_S = 5.0
# MLX's model library: fine-tuning (`run -- --model`) and `serve` load models with it on every rank, so every
# host needs it, at one version; doctor checks it (and `setup python` installs it) when this machine has it
LM_PACKAGE = "mlx-lm"


def version_here(package: str) -> str | None:
    """The version of `package` installed beside the python running clusterctl; None when it is not."""
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class DoctorOptions:
    deep: bool | None = None          # None: on when this machine has mpirun (or mlx.launch for ring)
    smoke_timeout: float = 90.0
