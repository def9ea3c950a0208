"""Every shell script clusterctl sends a host, built by the code that sends it, must parse under POSIX sh
(and the outer command under zsh, a Mac's login shell) and use no GNU-only tool or flag: a new GNU-ism
fails here, in the unit tier, before the fake-Darwin tier (tests/ssh/test_fake_darwin.py) or a real Mac
sees it. The checker is shown catching a deliberately bad script."""
import json
import os
import re
import shutil
import subprocess

import pytest

from clusterctl.hosts.probe import probe_script
from clusterctl.hosts.scripts import script_text
from clusterctl.hosts.quoting import shell_command
from clusterctl.hosts.remote import remote_command
from clusterctl.inventory import parse
from clusterctl.launch.backends import get
from clusterctl.launch.job import LAUNCH_HOST_FACTS
from clusterctl.launch.launchers import sweep_script
from clusterctl.launch.plan import LaunchPlan, module_check
from clusterctl.launch.site import LaunchSite
from clusterctl.transfer.rsync import remote_rsync_path

# GNU-only forms and what macOS has instead (docs/facts/macos.md#bsd-userland)
FORBIDDEN = [
    (r"\bstat\s+(-\S+\s+)*(-[a-zA-Z]*c\b|--format|--printf)", "stat -c (GNU): BSD stat formats with -f"),
    (r"\breadlink\s+(-\S+\s+)*-[a-zA-Z]*[fem]\b", "readlink -f (GNU; macOS only since 12.3)"),
    (r"\bsed\s+(-\S+\s+)*-i(?!\s*(''|\"\"|\.))", "sed -i without a suffix (BSD sed takes one: -i '')"),
    (r"\bsed\s+(-\S+\s+)*-r\b", "sed -r (GNU; BSD: -E)"),
    (r"-f?printf\b(?!\s+['\"%])", "find -printf (GNU)"),
    (r"\bdate\b[^\n;|&]*%N", "date +%N (GNU nanoseconds)"),
    (r"\bxargs\s+(-\S+\s+)*-(r\b|-no-run-if-empty)", "xargs -r (GNU)"),
    (r"\b(cp|mv|ln)\s+(-\S+\s+)*-[a-zA-Z]*T\b", "cp/mv/ln -T (GNU)"),
    (r"\bgrep\s+(-\S+\s+)*-[a-zA-Z]*P", "grep -P (GNU)"),
    (r"\bbase64\s+(-\S+\s+)*--decode", "base64 --decode (GNU; BSD: -D / -d)"),
    (r"(?<![\w/.-])(sha256sum|sha1sum|md5sum|timeout|setsid|nproc|flock|tac|realpath|stdbuf|numfmt)\s",
     "a GNU coreutils tool macOS does not have"),
    (r"(?<![\w/.-])ip\s+-", "iproute2's ip (not on macOS) without an ifconfig fallback"),
]


def gnu_isms(script: str) -> list[str]:
    """The GNU-only forms in a shell script. Comments are dropped, and single-quoted words are data (python
    programs, patterns, values), not commands: they are blanked first. A line that falls back to ifconfig may try ip first."""
    found = []
    text = re.sub(r"(^|(?<=\s))#[^\n]*", "", script, flags=re.M)      # comments say what they like
    text = re.sub(r"'[^']*'", "''", text)
    for line in text.splitlines():
        for pattern, why in FORBIDDEN:
            if re.search(pattern, line) and not (why.startswith("iproute2") and "ifconfig" in line):
                found.append(f"{why}: {line.strip()[:120]}")
    return found


@pytest.fixture
def cluster(tmp_path):
    return parse("defaults: {python: '~/venv/bin/python3', workdir: '~/work dir', env: {DYLD_LIBRARY_PATH: /opt/x}}\n"
                 "hosts:\n  - {name: mac-1, address: 10.0.0.1}\n  - {name: mac-2, address: 10.0.0.2}\n"
                 "launch: {backend: ring}\n", str(tmp_path / "inv.yaml"))


def every_script(cluster, tmp_path) -> dict[str, str]:
    """name -> the shell text a host receives, as the code builds it."""
    host = cluster.hosts[0]
    scripts = {
        "probe (doctor)": probe_script(python=host.python, workdir=host.workdir, mpi_lib_dir="/opt/homebrew/lib",
                                       peers=["mac-2"], mesh_config="Host mac-2\n  Port 22", ssh_config="/etc/x",
                                       mpi_libname="/opt/homebrew/lib/libmpi.dylib", full=True, rdma=True),
        "probe + module check (pre-flight)": probe_script(python=host.python, workdir=host.workdir, mpi_lib_dir=None,
                                                          peers=[], mesh_config=None, ssh_config=None, full=False)
        + module_check(host, "pkg.train"),
        "sweep": sweep_script("20261124-000000-abcdef", "~/work dir/.clusterctl/runs/20261124-000000-abcdef",
                              "~/work dir/runs/20261124-000000-abcdef"),
        "rsync's remote side": remote_rsync_path("~/work dir/sub") + " --server -lpt . .",
        "launch from the first host": LAUNCH_HOST_FACTS,
        "a command with env": remote_command(shell_command(["python3", "-c", "print(1)"], cwd="~/w d"), env=True),
        "the watchdog (hosts/scripts/watchdog.sh)": script_text("watchdog.sh"),
    }
    from clusterctl.setup.mesh import script as mesh_script
    for mode in ("prepare", "apply", "undo"):
        scripts[f"setup mesh ({mode})"] = mesh_script(mode, host, False, "ssh-ed25519 AAAA clusterctl-mesh:a",
                                                      "[a]:2222 ssh-ed25519 AAAA clusterctl-mesh:a")
    from clusterctl.setup.python import script as python_script
    scripts["setup python"] = python_script(host, "3.11", ["mlx==0.32.4", "numpy"], False)
    command = get("ring").command(cluster, LaunchPlan({}), program=["py", "-c", "x", "a b"], rank_env={"K": "v"},
                                  where=LaunchSite(str(tmp_path), "/usr/bin/ssh", False, ["python3"], ("-F", "/c")))
    rank = json.loads(command.files[0][1])["ranks"][0]["argv"][-1]       # what ssh hands the login shell
    scripts["a rank (clusterctl's rank starter)"] = rank
    return {name: text for name, text in scripts.items()}


def outer_and_inner(name, text):
    """The text the login shell parses (the watchdog-wrapped command) and the script /bin/sh then runs."""
    wrapped = text if text.startswith("exec /bin/sh -c ") else remote_command(text)
    return wrapped, text


def test_every_script_we_send_parses_under_sh_and_zsh(cluster, tmp_path):
    zsh = shutil.which("zsh")
    for name, text in every_script(cluster, tmp_path).items():
        outer, inner = outer_and_inner(name, text)
        for shell, script in (("/bin/sh", inner), ("/bin/sh", outer), (zsh, outer)):
            if shell is None:
                continue
            path = tmp_path / "s.sh"
            path.write_text(script)
            r = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True)
            assert r.returncode == 0, (name, shell, r.stderr)


def test_no_script_we_send_uses_a_gnu_only_tool_or_flag(cluster, tmp_path):
    for name, text in every_script(cluster, tmp_path).items():
        outer, inner = outer_and_inner(name, text)
        assert gnu_isms(inner) == [] and gnu_isms(outer) == [], name


def test_the_checker_catches_a_gnu_ism_and_a_syntax_error(tmp_path):
    bad = "size=$(stat -c %s \"$f\")\nwhile read x; do echo $x; done | xargs -r rm\nd=$(date +%s%N)\nsha256sum \"$f\"\n"
    assert [line.split(":")[0] for line in gnu_isms(bad)] == [
        "stat -c (GNU)", "xargs -r (GNU)", "date +%N (GNU nanoseconds)", "a GNU coreutils tool macOS does not have"]
    assert gnu_isms("s=$(stat -f %z \"$f\"); sed -i '' -e 's/a/b/' f; python3 -c 'import timeout'") == []
    path = tmp_path / "broken.sh"
    path.write_text("if [ -f x ]; then echo\n")        # no fi
    assert subprocess.run(["/bin/sh", "-n", str(path)], capture_output=True).returncode != 0


def test_the_sweep_removes_a_killed_writers_half_written_checkpoint_and_nothing_else(tmp_path):
    """The sweep's shell, run here by /bin/sh on a run directory with spaces: the temporary checkpoint directory
    goes, the whole checkpoints and `latest` stay."""
    import subprocess

    run = tmp_path / "work dir" / "runs" / "20261124-000000-abcdef"
    for name in ("step-000100", ".step-000200.tmp-0a1b2c"):
        (run / "checkpoints" / name).mkdir(parents=True)
        (run / "checkpoints" / name / "model.safetensors").write_text("x")
    (run / "checkpoints" / "latest").write_text("step-000100\n")
    script = sweep_script("20261124-000000-abcdef", str(tmp_path / "work dir" / ".clusterctl" / "runs" / "x"), str(run))
    assert subprocess.run(["/bin/sh", "-c", script]).returncode == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000100"]
