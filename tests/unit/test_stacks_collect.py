"""`clusterctl stacks` asks each host's ranks for their stacks (launch/stacks.py collect): a host whose answer
cannot be read is named with the status and last line of what ran there, never an internal error."""
from clusterctl.hosts.connector import Connector
from clusterctl.inventory import parse
from clusterctl.launch.stacks import collect


def test_a_host_whose_answer_cannot_be_read_is_named_with_its_status_and_last_line(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'not an answer'\necho 'python: cannot start' >&2\nexit 3\n")
    broken.chmod(0o755)
    cluster = parse(f"hosts: [{{name: here, local: true, python: {broken}, workdir: {tmp_path}}}]\n",
                    str(tmp_path / "inv.yaml"))
    stacks = collect(Connector(cluster), "20261127-000000-abcdef", answer_s=1)
    assert stacks.ranks == []
    assert stacks.errors == {"here": "could not read its answer (status 3): python: cannot start"}
