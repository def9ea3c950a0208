"""known_hosts as clusterctl's SSH library reads it (hosts/ssh.py load_known_hosts), on files written with real
keys: `@cert-authority` lines are skipped, `@revoked` keys are collected (the connection refuses them: see
tests/ssh/test_host_keys.py), and a line paramiko cannot read is one clear error naming the file (issue 25
item 4: both markers used to escape as an uncaught paramiko InvalidHostKey)."""
import subprocess

import paramiko
import pytest

from clusterctl.errors import ConnectError
from clusterctl.hosts.ssh import load_known_hosts


def public_key(tmp_path, name) -> tuple[str, str]:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True)
    kind, b64 = (tmp_path / f"{name}.pub").read_text().split()[:2]
    return kind, b64


def test_markers_are_understood_not_fatal(tmp_path):
    host, ca, bad = public_key(tmp_path, "host"), public_key(tmp_path, "ca"), public_key(tmp_path, "bad")
    path = tmp_path / "known_hosts"
    path.write_text(f"@cert-authority *.example.com {ca[0]} {ca[1]}\n"
                    f"h1.example.com {host[0]} {host[1]}\n"
                    f"# a comment\n@revoked * {bad[0]} {bad[1]}\n")
    keys = paramiko.HostKeys()
    revoked = load_known_hosts(keys, str(path), "h1")
    assert revoked == {bad: str(path)}
    assert keys.lookup("h1.example.com")[host[0]].get_base64() == host[1]
    assert keys.lookup("x.example.com") is None            # the CA line gave no trust of its own


def test_an_unreadable_line_names_the_file(tmp_path):
    path = tmp_path / "known_hosts"
    path.write_text("h1 ssh-ed25519 AAAA!!!not-base64\n")
    with pytest.raises(ConnectError, match=f"cannot read known_hosts file {path}"):
        load_known_hosts(paramiko.HostKeys(), str(path), "h1")
