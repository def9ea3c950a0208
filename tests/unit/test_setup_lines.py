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


def test_setup_python_requirements_pin_this_machines_versions(tmp_path, monkeypatch):
    """MLX at this machine's version (the cpu extra on a Linux host), then numpy and PyYAML, or a
    requirements file's lines with MLX pinned beside them unless the file names it; and mlx-lm at this
    machine's version whenever this machine has it (issue 45: a requirements file's bare `mlx-lm` line was
    installed unpinned, whatever version the index had that day)."""
    import importlib.metadata as md

    import pytest

    from clusterctl.errors import UsageError
    from clusterctl.setup import python
    from clusterctl.setup.python import check_extras, requirements
    mlx, numpy, pyyaml, lm = (md.version(n) for n in ("mlx", "numpy", "PyYAML", "mlx-lm"))
    assert requirements("Linux") == [f"mlx[cpu]=={mlx}", f"numpy=={numpy}", f"PyYAML=={pyyaml}", f"mlx-lm=={lm}"]
    assert requirements("Darwin")[0] == f"mlx=={mlx}"
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("# what the project needs\nmlx-lm==0.28.0  # the model code\n\ntokenizers\n")
    assert requirements("Darwin", str(reqs)) == [f"mlx=={mlx}", "mlx-lm==0.28.0", "tokenizers"]    # its own pin
    reqs.write_text("MLX>=0.30\nnumpy\nmlx_lm[train]\n")
    assert requirements("Darwin", str(reqs)) == ["MLX>=0.30", "numpy", f"mlx-lm[train]=={lm}"]
    reqs.write_text("mlx-lm ; python_version >= '3.10'\n")
    assert requirements("Darwin", str(reqs)) == [f"mlx=={mlx}", f"mlx-lm=={lm}; python_version >= '3.10'"]
    reqs.write_text("tokenizers\n")
    assert requirements("Darwin", str(reqs)) == [f"mlx=={mlx}", "tokenizers", f"mlx-lm=={lm}"]
    with pytest.raises(UsageError, match="--requirements .*missing.txt: No such file"):
        requirements("Darwin", str(tmp_path / "missing.txt"))
    check_extras(True)          # this machine has mlx-lm: --with lm can be given
    # a machine without mlx-lm (its installed versions are the function's input): none is added, and asking
    # for it is one line saying what to do
    monkeypatch.setattr(python, "version_here", lambda name: None if name == "mlx-lm" else md.version(name))
    assert requirements("Darwin") == [f"mlx=={mlx}", f"numpy=={numpy}", f"PyYAML=={pyyaml}"]
    reqs.write_text("mlx-lm\n")
    assert requirements("Darwin", str(reqs)) == [f"mlx=={mlx}", "mlx-lm"]
    with pytest.raises(UsageError) as e:
        check_extras(True)
    assert str(e.value) == ("--with lm: this machine has no mlx-lm, so there is no version to give every host: "
                            "install it here first (pip install mlx-lm), then run setup python again")
    check_extras(False)


def test_offline_wheels_are_fetched_for_each_hosts_own_platform_tags():
    """What `setup python --offline` asks pip download for, from the hosts' own answers (sw_vers as recorded
    on a Mac: tests/fixtures/macos; getconf on Debian 12)."""
    import os

    from clusterctl.setup.python import platform_key, wheel_platforms
    fixtures = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "macos")
    with open(os.path.join(fixtures, "sw_vers-productVersion.15.6.1.txt")) as f:
        mac = platform_key("Darwin\narm64\n" + f.read())
    assert mac == ("Darwin", "arm64", "15.6.1")
    tags = wheel_platforms(*mac)
    assert tags[:2] == ["macosx_15_0_arm64", "macosx_15_0_universal2"] and tags[-1] == "macosx_11_0_universal2"
    assert "macosx_14_0_arm64" in tags and not any("x86_64" in t for t in tags)
    debian = platform_key("Linux\nx86_64\nglibc 2.36\n")
    assert debian == ("Linux", "x86_64", "2.36")
    tags = wheel_platforms(*debian)
    assert tags[0] == "manylinux_2_36_x86_64" and tags[-2:] == ["manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    intel = wheel_platforms("Darwin", "x86_64", "13.6")
    assert intel[0] == "macosx_13_0_x86_64" and "macosx_10_9_x86_64" in intel


def test_with_supervisor_adds_clusterctls_own_requirements_at_this_machines_versions_once():
    from clusterctl.setup.python import SUPERVISOR_PACKAGES, with_supervisor

    got = with_supervisor(["mlx==0.32.4", "PyYAML==6.0.1"])
    assert got[:2] == ["mlx==0.32.4", "PyYAML==6.0.1"]          # the user's pin of one of them is kept
    added = got[2:]
    assert [line.split("==")[0] for line in added] == [n for n in SUPERVISOR_PACKAGES if n != "PyYAML"]
    assert all("==" in line for line in added)                   # this machine has them all: pinned
