"""doctor against the real loopback sshd cluster, with real mpirun and mlx.launch."""
import json
import subprocess
import sys
import time

import clirun
import pytest
from sshcluster import requires_private_roots

from clusterctl.doctor import DOCTOR_CONNECT_TIMEOUT_S, DoctorOptions, run_doctor
from clusterctl.hosts.connector import Connector
from clusterctl.doctor.report import FAIL, PASS, WARN
from clusterctl.inventory import load

pytestmark = pytest.mark.ssh


def rows(report, check=None, status=None, host=None):
    return [f for f in report.findings if (check is None or f.check == check)
            and (status is None or f.status == status) and (host is None or f.host == host)]


def doctor(cluster, connect_timeout=DOCTOR_CONNECT_TIMEOUT_S, **options):
    return run_doctor(Connector(load(cluster.inventory), connect_timeout=connect_timeout), DoctorOptions(**options))


def test_healthy_four_hosts_all_green_with_real_mpi_and_ring_smoke_tests(make_cluster):
    cluster = make_cluster(4)
    r = clirun.clusterctl("doctor", "--json", "--hosts", str(cluster.inventory), timeout=300)
    doc = json.loads(r.stdout)
    problems = [c for c in doc["checks"] if c["status"] != "pass"]
    assert r.returncode == 0 and doc["ok"] is True and problems == [], problems
    assert doc["hosts"] == ["h1", "h2", "h3", "h4"]
    mesh = [(c["host"], c["peer"]) for c in doc["checks"] if c["check"] == "ssh-mesh"]
    assert sorted(mesh) == [(a, b) for a in doc["hosts"] for b in doc["hosts"] if a != b]     # 12 ordered pairs
    assert len([c for c in doc["checks"] if c["check"] == "data-plane"]) == 12
    smoke = {c["check"]: c["detail"] for c in doc["checks"] if c["check"].endswith("smoke")}
    assert "mpirun ran 4 ranks; every rank saw world size 4 and all_sum 10" in smoke["mpi-smoke"]
    assert "clusterctl's rank starter ran 4 ranks; every rank saw world size 4 and all_sum 10" in smoke["ring-smoke"]
    for c in doc["checks"]:
        assert set(c) == {"check", "host", "peer", "status", "detail", "fix"}
    # the all-to-all really went host to host: every sshd accepted our key more than once (controller + peers)
    for i in range(1, 5):
        assert cluster.log(i).count("Accepted publickey") >= 1 + 3


def test_a_stopped_host_fails_by_name_and_the_rest_are_still_checked_quickly(make_cluster):
    cluster = make_cluster(4)
    cluster.stop_host(3)
    start = time.monotonic()
    report = doctor(cluster, connect_timeout=60)
    elapsed = time.monotonic() - start
    # A refused connection is known at once; a doctor that waited on the stopped host (its connect
    # timeout, or the probe deadline after it) would take over 60 s. The bound sits far below that and
    # far above the second or so this takes, so a loaded machine cannot fail it.
    assert elapsed < 30, elapsed
    assert not report.ok
    ssh = {f.host: f for f in rows(report, "ssh")}
    assert ssh["h3"].status == FAIL and "connection refused" in ssh["h3"].detail and "sshd" in ssh["h3"].fix
    assert all(ssh[h].status == PASS for h in ("h1", "h2", "h4"))
    into_h3 = [f for f in rows(report, "ssh-mesh") if f.peer == "h3"]
    assert sorted(f.host for f in into_h3) == ["h1", "h2", "h4"] and all(f.status == FAIL for f in into_h3)
    assert all(f.status == PASS for f in rows(report, "ssh-mesh") if f.peer != "h3")
    for check in ("python", "mlx", "mpirun", "libmpi"):
        assert sorted(f.host for f in rows(report, check, PASS)) == ["h1", "h2", "h4"], check
    smoke = rows(report, "mpi-smoke")
    assert smoke[0].status == WARN and "not run: h3" in smoke[0].detail


def test_a_host_that_rejects_our_key_is_reported_without_hanging(make_cluster):
    cluster = make_cluster(3)
    cluster.refuse_key(2)
    start = time.monotonic()
    report = doctor(cluster, connect_timeout=60)
    # A host that sat at a password prompt would hold doctor for the 60 s connect timeout and more; a
    # refused key is known at once. The bound sits far below that, so a loaded machine cannot fail it.
    assert time.monotonic() - start < 30
    f = rows(report, "ssh", host="h2")[0]
    assert f.status == FAIL and "refused our keys" in f.detail and "would ask for a password" in f.detail
    assert "ssh-copy-id" in f.fix
    assert all(g.status == FAIL and "Permission denied" in g.detail
               for g in rows(report, "ssh-mesh") if g.peer == "h2")


def test_b_cannot_reach_c_fails_that_pair_only(make_cluster):
    cluster = make_cluster(4)
    requires_private_roots(cluster, "to give one host its own view of the ssh config")
    cluster.break_ssh(2, 3)
    assert cluster.ssh(2, "true").returncode == 0 and cluster.ssh(3, "true").returncode == 0   # we reach both
    report = doctor(cluster, deep=False)
    failing = [(f.host, f.peer) for f in rows(report, "ssh-mesh", FAIL)]
    assert failing == [("h2", "h3")]
    bad = rows(report, "ssh-mesh", FAIL)[0]
    assert "Permission denied" in bad.detail and bad.fix.startswith("on h2: ssh-copy-id h3")
    assert len(rows(report, "ssh-mesh", PASS)) == 11
    assert all(f.status == PASS for f in rows(report, "ssh"))


@pytest.fixture(scope="session")
def other_mlx_venv(tmp_path_factory):
    """A real virtualenv with another mlx release, made from the same base Python."""
    venv = tmp_path_factory.mktemp("other-mlx") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          "mlx[cpu]==0.32.3"], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-2000:]
    return venv


def test_missing_mpirun_and_another_mlx_are_each_named(make_cluster, other_mlx_venv):
    if sys.prefix == sys.base_prefix:
        pytest.skip("the suite must run in a virtualenv: a host gets another one mounted over it")
    cluster = make_cluster(4)
    requires_private_roots(cluster, "to give hosts different files at the same path")
    cluster.set_session_path(2, cluster.path_without("mpirun"))
    cluster.mount_over(3, sys.prefix, str(other_mlx_venv))      # same python path, another mlx inside
    report = doctor(cluster)
    mpirun = rows(report, "mpirun", FAIL)
    assert [f.host for f in mpirun] == ["h2"] and "not on the non-interactive PATH" in mpirun[0].detail
    parity = rows(report, "parity", FAIL)
    assert [f.host for f in parity] == ["h3"]
    assert parity[0].detail == "mlx 0.32.3 here, 0.32.4 on h1, h2, h4"
    from importlib.metadata import version          # this machine has mlx-lm; the other venv does not
    lm = rows(report, "mlx-lm", FAIL)
    assert [(f.host, f.detail) for f in lm] == [("h3", f"mlx-lm is not installed in {sys.executable} "
                                                       f"(this machine has {version('mlx-lm')})")]
    assert rows(report, "mpi-smoke")[0].status == WARN and "h2" in rows(report, "mpi-smoke")[0].detail


def test_mlx_unable_to_load_libmpi_fails_the_smoke_test_with_the_fix(make_cluster):
    cluster = make_cluster(2)
    text = cluster.inventory.read_text().replace("hosts:", "  env: {MLX_MPI_LIBNAME: /nonexistent/libmpi.so}\nhosts:")
    cluster.inventory.write_text(text)
    report = doctor(cluster)
    libmpi = rows(report, "libmpi", FAIL)
    assert sorted(f.host for f in libmpi) == ["h1", "h2"]
    assert "MLX_MPI_LIBNAME=/nonexistent/libmpi.so, which does not exist" in libmpi[0].detail
    smoke = rows(report, "mpi-smoke")[0]        # and the real launch shows what MLX itself makes of it
    assert "mx.distributed.init failed" in smoke.detail
    assert "mpi_lib_dir" in smoke.fix and "MLX_MPI_LIBNAME" in smoke.fix
    assert not report.ok
