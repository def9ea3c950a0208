"""Host keys on the real loopback cluster (issue 25 item 4): a key marked `@revoked` in known_hosts is refused
by clusterctl's own SSH connections, as OpenSSH refuses it, and a `@cert-authority` line breaks nothing."""
import clirun
import pytest

pytestmark = pytest.mark.ssh


def test_a_revoked_host_key_is_refused_and_a_ca_line_is_harmless(make_cluster, tmp_path):
    cluster = make_cluster(2)
    kind, b64 = (cluster.host(1).dir / "host_ed25519.pub").read_text().split()[:2]
    with open(cluster.known_hosts, "a") as f:
        f.write(f"@cert-authority *.example.com {kind} {b64}\n@revoked * {kind} {b64}\n")
    r = clirun.clusterctl("exec", "--hosts", str(cluster.inventory), "--", "echo", "up", cwd=tmp_path, own_cache=True)
    assert r.returncode == 1 and r.stdout == "[1 h2] up\n", r.stdout + r.stderr        # the other host is unharmed
    assert r.stderr.startswith("[0 h1] error: the host key of ") and \
        f"(ssh-ed25519) is marked @revoked in {cluster.known_hosts}: refused" in r.stderr, r.stderr
    ssh = cluster.ssh(1, "true")                                                     # OpenSSH agrees
    assert ssh.returncode != 0 and "REVOKED" in ssh.stderr.upper(), ssh.stderr
