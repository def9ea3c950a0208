"""setup mesh's pure builders (clusterctl/setup/mesh.py)."""


def test_setup_mesh_lines_name_a_host_as_the_launch_does(tmp_path):
    """known_hosts: every name the launch may use for the host, [name]:port off port 22; both kinds of line
    end with the mark undo looks for (clusterctl/setup/mesh.py)."""
    from clusterctl.inventory import parse
    from clusterctl.setup.mesh import authorized_keys_line, known_hosts_line
    a, b = parse("hosts:\n  - {name: mac-1, hostname: mac-1.local, address: 10.0.0.1, port: 2222}\n"
                 "  - {name: mac-2}\n", str(tmp_path / "i.yaml")).hosts
    assert known_hosts_line(a, "ssh-ed25519", "AAAAC3") == \
        "[mac-1]:2222,[mac-1.local]:2222,[10.0.0.1]:2222 ssh-ed25519 AAAAC3 clusterctl-mesh:mac-1"
    assert known_hosts_line(b, "ecdsa-sha2-nistp256", "AAAAE2") == "mac-2 ecdsa-sha2-nistp256 AAAAE2 clusterctl-mesh:mac-2"
    assert authorized_keys_line(b, "ssh-ed25519 AAAAC3xyz clusterctl-mesh@mac-2\n") == \
        "ssh-ed25519 AAAAC3xyz clusterctl-mesh:mac-2"
