"""`clusterctl setup mesh` on stock-sshd test hosts, each with its own ~/.ssh (a private directory mounted over
root's ~/.ssh on that host: sshd reads authorized_keys there, ssh its known_hosts and keys), whose mesh is broken:
no host knows another's key, known_hosts empty, the inventory strict about host keys and naming no mesh key.

setup mesh --dry-run changes nothing; setup mesh makes doctor's mesh green; a second run changes no file;
--undo puts every file (the hosts' and the inventory) back byte for byte.
"""
import json
import os

import clirun
import pytest
from sshcluster import requires_private_roots

pytestmark = pytest.mark.ssh


def clusterctl(cluster, *args, cwd):
    return clirun.clusterctl(*args, cwd=cwd, timeout=300, env={**cluster.client_env(),
                                                                "XDG_CACHE_HOME": str(cwd / ".cache")})


def snapshot(cluster):
    """Every file of every host's ~/.ssh and the inventory: path -> (bytes, mode, mtime_ns)."""
    files = {}
    for host in cluster.hosts:
        for name in sorted(os.listdir(host.dir / "dotssh")):
            path = host.dir / "dotssh" / name
            st = path.stat()
            files[str(path)] = (path.read_bytes(), st.st_mode, st.st_mtime_ns)
    st = cluster.inventory.stat()
    files[str(cluster.inventory)] = (cluster.inventory.read_bytes(), st.st_mode, st.st_mtime_ns)
    return files


def mesh_rows(cluster, cwd):
    r = clusterctl(cluster, "doctor", "--hosts", str(cluster.inventory), "--no-deep", "--json", cwd=cwd)
    return [c for c in json.loads(r.stdout)["checks"] if c["check"] == "ssh-mesh"]


def test_setup_mesh_makes_the_mesh_green_changes_nothing_twice_and_undoes_byte_exact(make_cluster, tmp_path):
    cluster = make_cluster(3, stock_sshd=True)
    requires_private_roots(cluster, "each host its own ~/.ssh")
    cluster.own_dot_ssh()
    # a user's own line without a final newline: undo must give it back exactly so
    (cluster.hosts[1].dir / "dotssh" / "authorized_keys").write_text("ssh-ed25519 AAAAmine user@laptop")
    (cluster.hosts[1].dir / "dotssh" / "authorized_keys").chmod(0o600)
    assert clusterctl(cluster, "exec", "--hosts", str(cluster.inventory), "--", "true", cwd=tmp_path).returncode == 0
    text = cluster.inventory.read_text()       # the controller knows the hosts now: from here on, strict
    assert "mesh_identity_file" in text
    text = "\n".join(line for line in text.splitlines() if "mesh_identity_file" not in line)
    cluster.inventory.write_text("# my cluster\nhost_key_checking: strict\n" + text + "\n")
    assert not any(row["status"] == "pass" for row in mesh_rows(cluster, tmp_path))       # broken: 0 of 6
    before = snapshot(cluster)

    dry = clusterctl(cluster, "setup", "mesh", "--hosts", str(cluster.inventory), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "would create the key pair" in dry.stdout and "would set defaults.mesh_identity_file" in dry.stdout
    assert snapshot(cluster) == before

    r = clusterctl(cluster, "setup", "mesh", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "doctor's mesh check: 6 of 6 host pairs log in (all)" in r.stdout
    assert [row["status"] for row in mesh_rows(cluster, tmp_path)] == ["pass"] * 6
    assert cluster.inventory.read_text().startswith("# my cluster\n")          # comments kept
    for host in cluster.hosts:                # each private key stays on its host
        secret = (host.dir / "dotssh" / "clusterctl_mesh").read_bytes()
        others = [p for h in cluster.hosts if h is not host for p in (h.dir / "dotssh").iterdir()]
        assert not any(secret in p.read_bytes() for p in others)
    assert (cluster.hosts[1].dir / "dotssh" / "authorized_keys").read_text().startswith(
        "ssh-ed25519 AAAAmine user@laptop\nssh-ed25519 ")

    after = snapshot(cluster)
    again = clusterctl(cluster, "setup", "mesh", "--hosts", str(cluster.inventory), cwd=tmp_path)
    assert again.returncode == 0 and "nothing to change" in again.stdout, again.stdout + again.stderr
    assert snapshot(cluster) == after

    undo = clusterctl(cluster, "setup", "mesh", "--hosts", str(cluster.inventory), "--undo", cwd=tmp_path)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    restored = snapshot(cluster)
    assert {p: v[:2] for p, v in restored.items()} == {p: v[:2] for p, v in before.items()}
