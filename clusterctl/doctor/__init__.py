"""clusterctl doctor: everything that breaks a distributed MLX job, checked in one round trip per host.

    run_doctor(connector, DoctorOptions()) -> Report     # the connector carries the connect timeout

diagnose.py runs it (probe every host, pure checks, the smoke tests); checks.py turns facts into findings;
smoke.py launches a real job per backend; report.py holds findings and draws them; options.py says what
can be asked. run_doctor is imported on first use, so that the CLI starts without the whole of doctor.
"""
from __future__ import annotations

from .options import DOCTOR_CONNECT_TIMEOUT_S, DoctorOptions

__all__ = ["DOCTOR_CONNECT_TIMEOUT_S", "DoctorOptions", "run_doctor"]


def __getattr__(name: str):
    if name == "run_doctor":
        from .diagnose import run_doctor
        return run_doctor
    raise AttributeError(name)
