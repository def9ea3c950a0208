"""The command line, through click's CliRunner and through the real `python -m clusterctl` entry point."""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from click.testing import CliRunner
from clirun import clusterctl

from clusterctl import __version__
from clusterctl.cli import EXAMPLES, cli
from clusterctl.inventory import load
from clusterctl.train import presets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_version():
    r = clusterctl("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"clusterctl {__version__}"


def test_help_lists_every_command_with_a_summary_and_an_example():
    r = clusterctl("--help")
    assert r.returncode == 0
    commands = sorted(cli.commands)
    assert commands == sorted(EXAMPLES)        # every command registered an example
    flat = " ".join(r.stdout.split())          # click wraps long lines to the terminal's width
    for name in commands:
        summary = cli.commands[name].get_short_help_str(limit=70)
        assert not summary.endswith("..."), f"{name}'s summary is cut short"
        assert f"  {name} " in r.stdout and f"{name} {summary}" in flat
        assert f"e.g. {EXAMPLES[name]}" in flat


def test_hosts_table_shows_the_local_inventory():
    r = clusterctl("hosts", "--hosts", os.path.join(REPO, "inventory", "local.yaml"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["RANKS", "NAME", "CONNECT", "USER", "ADDRESS", "PYTHON", "WORKDIR"]
    assert lines[1].split()[:3] == ["0-1", "localhost", "(local)"]
    assert lines[-1] == "1 hosts, world size 2, backend ring"


@pytest.mark.parametrize("text,line", [
    ("hosts:\n  - name: a\n    port: nope\n", 3),
    ("hosts:\n\t- a\n", 2),
    ("hosts: [a, a]\n", 1),
    ("hosts: [\n", 2),
])
def test_malformed_inventory_is_one_line_exit_2_no_traceback(tmp_path, text, line):
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    for command in (["hosts"], ["exec", "--sh", "true"]):
        r = clusterctl(*command, "--hosts", str(path))
        assert r.returncode == 2, r
        assert r.stdout == ""
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: {path}:{line}: "), r.stderr
        assert "Traceback" not in r.stderr


def test_missing_inventory_and_usage_errors_exit_2():
    r = clusterctl("hosts", "--hosts", "/nonexistent/inventory.yaml")
    assert (r.returncode, r.stderr) == (2, "error: /nonexistent/inventory.yaml: no such inventory file\n")
    r = clusterctl("exec", "--hosts", os.path.join(REPO, "inventory", "local.yaml"))
    assert r.returncode == 2 and "give either a command" in r.stderr and "Traceback" not in r.stderr
    r = clusterctl("no-such-command")
    assert r.returncode == 2 and "No such command" in r.stderr


def test_debug_shows_the_traceback(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts: []\n")
    r = clusterctl("--debug", "hosts", "--hosts", str(path))
    assert r.returncode != 0 and "Traceback" in r.stderr and "InventoryError" in r.stderr


def test_exec_on_this_machine_prefixes_rank_and_host_and_reports_failures():
    local = os.path.join(REPO, "inventory", "local.yaml")
    r = clusterctl("exec", "--hosts", local, "--", "echo", "hello; $(world)")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[0 localhost] hello; $(world)\n"
    assert r.stderr == "1 ok, 0 failed\n"
    r = clusterctl("exec", "--hosts", local, "--sh", "echo out; echo err >&2; exit 3")
    assert r.returncode == 1
    assert r.stdout == "[0 localhost] out\n"
    assert "[0 localhost] err\n" in r.stderr and "[0 localhost] exited 3" in r.stderr


def test_exec_json():
    local = os.path.join(REPO, "inventory", "local.yaml")
    r = clusterctl("exec", "--json", "--hosts", local, "--timeout", "0.5", "--", "sleep", "5")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["ok"] is False
    assert doc["hosts"][0]["host"] == "localhost" and "timed out after 0.5s" in doc["hosts"][0]["error"]


def test_init_writes_a_valid_inventory_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "inventory.yaml"
    runner = CliRunner()
    r = runner.invoke(cli, ["init", "studio-1", "studio-2", "--user", "alice", "--address", "192.168.10.1",
                            "--address", "192.168.10.2", "--backend", "ring", "-o", str(out)])
    assert r.exit_code == 0, r.output
    c = load(out)
    assert [(h.name, h.user, h.address) for h in c.hosts] == \
        [("studio-1", "alice", "192.168.10.1"), ("studio-2", "alice", "192.168.10.2")]
    assert c.launch.backend == "ring"
    before = out.read_text()
    r = runner.invoke(cli, ["init", "x", "-o", str(out)])
    assert r.exit_code == 2 and "exists" in r.output and out.read_text() == before
    r = runner.invoke(cli, ["init", "x", "y", "--address", "10.0.0.1", "-o", str(tmp_path / "o.yaml")])
    assert r.exit_code == 2 and "2 hosts" in r.output


def test_init_writes_ssh_settings_that_hosts_resolves_and_shows_the_rest_commented(tmp_path):
    """Issue 45: init took no --port or --identity-file, so a non-default SSH setup meant editing YAML first."""
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "lab").write_text("not really a key\n")
    (tmp_path / "conf").mkdir()
    out = tmp_path / "conf" / "inv.yaml"
    r = clusterctl("init", "h1", "h2", "--user", "u", "--port", "2222", "--identity-file", "keys/lab", "-o",
                   "conf/inv.yaml", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = out.read_text()
    assert '  user: "u"\n  port: 2222\n  identity_file: "../keys/lab"\n' in text      # from the inventory's folder
    assert "  # model_store: ~/.cache/clusterctl/models" in text and "  # slots: 1" in text
    hosts = json.loads(clusterctl("hosts", "--json", "--hosts", str(out), env={**os.environ, "HOME": str(tmp_path)}).stdout)
    assert [(h["name"], h["user"], h["connect"], h["identity_file"], h["model_store"]) for h in hosts["hosts"]] == \
        [(n, "u", f"{n}:2222", str(tmp_path / "keys" / "lab"), "~/.cache/clusterctl/models") for n in ("h1", "h2")]
    bare = clusterctl("init", "h1", "-o", str(tmp_path / "bare.yaml"))      # nothing given: each line shows where
    assert bare.returncode == 0 and "  # port: 22 " in (tmp_path / "bare.yaml").read_text()
    for option, value, says in [("--port", "70000", "--port 70000: port must be a whole number from 1 to 65535, "
                                                     "not the number 70000"),
                                ("--user", " a", "--user  a: user ' a' is not a valid user name"),
                                ("--port", "x", "'x' is not a valid integer")]:
        bad = clusterctl("init", "h1", option, value, "-o", str(tmp_path / "bad.yaml"))
        errors = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and says in errors[-1] and not (tmp_path / "bad.yaml").exists(), bad.stderr
    missing = clusterctl("init", "h1", "--identity-file", "~/no/such/key", "-o", str(tmp_path / "m.yaml"),
                         env={**os.environ, "HOME": str(tmp_path)})
    assert missing.returncode == 0 and missing.stderr.startswith("warning: --identity-file ~/no/such/key: no such "
                                                                 "file on this machine"), missing.stderr


def test_init_refuses_names_it_would_not_read_back(tmp_path):
    out = tmp_path / "inventory.yaml"
    r = clusterctl("init", "ok-host", "bad;host", "-o", str(out))
    assert r.returncode == 2 and "OpenSSH refuses" in r.stderr and not out.exists()


def test_ctrl_c_during_local_exec_kills_the_local_command():
    import signal
    import time

    duration = f"300.{os.getpid()}{time.monotonic_ns() % 10**9}"
    proc = subprocess.Popen([sys.executable, "-m", "clusterctl", "exec", "--hosts",
                             os.path.join(REPO, "inventory", "local.yaml"), "--sh", f"sleep {duration}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def running():
        return subprocess.run(["pgrep", "-f", f"^sleep {duration}$"], capture_output=True, text=True).stdout.split()

    deadline = time.monotonic() + 20
    while not running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and "Traceback" not in err
    deadline = time.monotonic() + 30     # generous: the loop ends as soon as the sleep is gone
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running()


def test_hostfile_to_stdout_and_its_usage_errors(tmp_path):
    local = os.path.join(REPO, "inventory", "local.yaml")
    r = clusterctl("hostfile", "--hosts", local)
    assert r.returncode == 0 and r.stdout.splitlines()[1:] == ["localhost slots=2"]
    r = clusterctl("hostfile", "--hosts", local, "--format", "mpich")
    assert r.stdout.splitlines()[1:] == ["localhost:2"]
    for args, words in [(["--print-command"], "needs the script"),
                        (["--print-command", "--", "t.py"], "needs -o FILE"),
                        (["--format", "mpich", "-o", str(tmp_path / "h"), "--print-command", "--", "t.py"], "Open MPI"),
                        (["--", "t.py"], "only used with --print-command")]:
        r = clusterctl("hostfile", "--hosts", local, *args)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    bad = tmp_path / "bad.tmpl"
    bad.write_text("@host $nmae\n")
    r = clusterctl("hostfile", "--hosts", local, "--template", str(bad))
    assert (r.returncode, r.stderr) == (2, f"error: {bad}: unknown placeholder $nmae\n")


def test_hostfile_print_command_on_this_machine(tmp_path):
    out = tmp_path / "hf"
    r = clusterctl("hostfile", "--hosts", os.path.join(REPO, "inventory", "local.yaml"), "-o", str(out),
                   "--print-command", "--", "/srv/train.py", "--steps", "10")
    assert r.returncode == 0, r.stderr
    assert out.read_text().splitlines()[1:] == ["localhost slots=2"]
    line = r.stdout.strip()
    assert f"--hostfile {out} -np 2" in line and line.endswith(f"-- {sys.executable} /srv/train.py --steps 10")


def test_run_without_hosts_uses_this_machine_with_two_ring_ranks(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("import os, sys\nimport mlx.core as mx\ng = mx.distributed.init(backend='ring', strict=True)\n"
                      "print(g.rank(), g.size(), os.getcwd() == os.path.expanduser(sys.argv[1]), flush=True)\n")
    # ranks work where run was started (a relative SCRIPT is the one here)
    r = clusterctl("run", str(script), str(tmp_path), "--runs-dir", str(tmp_path / "runs"), timeout=120,
                   cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.splitlines()) == ["[rank 0 localhost] 0 2 True", "[rank 1 localhost] 1 2 True"]
    assert "2 ranks over ring" in r.stderr and "all 2 ranks finished" in r.stderr


TINY = ["--n-layers", "1", "--dim", "32", "--mlp-dim", "64", "--n-heads", "2", "--block-size", "32",
        "--batch-size", "4", "--steps", "6", "--report-every", "3", "--eval-every", "6", "--ckpt-every", "6"]


def test_run_without_a_script_trains_the_bundled_model_here(tmp_path):
    """The README's main job, small: `clusterctl run -- FLAGS` is the bundled trainer on 2 ring ranks."""
    r = clusterctl("run", "--", *TINY, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "clusterctl.train on 2 ranks over ring" in r.stderr
    assert "[rank 0 localhost] dp on 2 rank(s)" in r.stdout and "step 6/6" in r.stdout
    [run_dir] = list((tmp_path / "runs").iterdir())
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if "loss" in m] == [1, 3, 6]          # rank 0 wrote the run's own metrics
    assert (run_dir / "checkpoints" / "step-000006" / "model.safetensors").is_file()
    assert (run_dir / "rank-0.log").is_file() and (run_dir / "rank-1.log").is_file()


def test_the_readme_main_job_as_written_learns(tmp_path):
    """The README's main job exactly as written (what follows `.venv/bin/`, read from the README: a bare
    `clusterctl run` picks the bundled trainer's preset by device): it names its preset, the printed loss
    falls at every report, the final held-out loss is at least 30% below the first step's loss, and the run
    stops at the preset's last step."""
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    command = readme.split("```sh\n", 1)[1].split("\n", 1)[0]
    program, *args = shlex.split(command.rsplit("&& .venv/bin/", 1)[1])
    assert program == "clusterctl" and args[:1] == ["run"], command
    r = clusterctl(*args, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    preset = re.search(r"^\[rank 0 localhost\] preset (\w+) \((chosen for \w+|given)\b", r.stdout, re.M)
    assert preset, r.stdout[:2000]
    printed = [float(x) for x in re.findall(r"^\[rank 0 localhost\] step +\d+/\d+ \| loss ([\d.]+)", r.stdout, re.M)]
    assert len(printed) > 2 and all(b < a for a, b in zip(printed, printed[1:])), printed
    [run_dir] = list((tmp_path / "runs").iterdir())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [m for m in records if "loss" in m]
    held_out = [m["val_loss"] for m in records if "val_loss" in m]
    assert losses[0]["step"] == 1 and held_out[-1] <= 0.7 * losses[0]["loss"], (losses, held_out)
    assert losses[-1]["step"] == presets.PRESETS[preset.group(1)].settings["steps"]


def test_run_refuses_shards_of_another_world_size_before_launching(tmp_path):
    prep = clusterctl("data", "prepare", "embedded:60", "--world", "3", "--out", str(tmp_path / "d3"),
                      timeout=60)
    assert prep.returncode == 0, prep.stderr
    r = clusterctl("run", "--data", str(tmp_path / "d3"), "--", "--steps", "2", timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().endswith("run `clusterctl data prepare --world 2`"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()   # nothing launched


def test_run_here_from_the_home_directory_copies_nothing(tmp_path):
    """Only copying a home directory to other hosts is refused; running here from it copies nothing."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "hi.py").write_text("print('hi from home')\n")
    env = {**os.environ, "HOME": str(home)}
    r = clusterctl("run", "hi.py", timeout=120, cwd=home, env=env)
    assert r.returncode == 0 and "[rank 1 localhost] hi from home" in r.stdout, r.stdout + r.stderr
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(f"hosts: [{{name: here, local: true, slots: 2, workdir: {json.dumps(str(tmp_path / 'w'))}}}]\n"
                         "launch: {backend: ring}\n")
    r = clusterctl("run", "hi.py", "--hosts", str(inventory), timeout=120, cwd=home, env=env)
    assert r.returncode == 1 and "not copying" in r.stderr and "--no-sync" in r.stderr, r.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_a_killed_run_leaves_no_launcher_or_rank_behind_on_this_machine(tmp_path, backend):
    """kill -9 gives clusterctl no chance to clean up: the launcher's watchdog sees our pipe close and
    stops the launcher and every rank (before, mpirun and both ranks lived on)."""
    import signal
    import time

    from clusterctl.launch import backends

    if backends.get(backend).launcher_here() is None:
        pytest.skip(f"{backends.get(backend).launcher_name} is not installed here")
    (tmp_path / "sleepy.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-m", "clusterctl", "run", "sleepy.py", "--backend", backend,
                             "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def ranks_up() -> bool:
        logs = list((tmp_path / "runs").glob("*/rank-*.log"))
        return len(logs) == 2 and all(p.read_text().startswith("up") for p in logs)

    deadline = time.monotonic() + 60
    while not ranks_up() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ranks_up(), proc.stderr.read() if proc.poll() is not None else "ranks did not start within 60 s"
    [run_id] = os.listdir(tmp_path / "runs")

    def survivors() -> list[str]:
        found = subprocess.run(["pgrep", "-f", f"clusterctl-ru[n]-{run_id}"], capture_output=True, text=True)
        return found.stdout.split()

    assert survivors()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 15          # the watchdog's TERM, then its KILL after the grace period
    while survivors() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert survivors() == []


def test_the_cli_prints_every_event_run_reports():
    """cli.printedrun.PrintedRun is duck-typed (run.py is imported only when `run` runs): it must answer every
    RunEvents method, with the same parameters."""
    import inspect

    from clusterctl.cli.printedrun import PrintedRun
    from clusterctl.run.events import RunEvents

    events = [n for n, f in inspect.getmembers(RunEvents, inspect.isfunction) if not n.startswith("_")]
    assert events and all(hasattr(PrintedRun, n) for n in events), events
    for name in events:
        def params(cls):
            return list(inspect.signature(getattr(cls, name)).parameters)
        assert params(PrintedRun) == params(RunEvents), name


def test_an_option_both_accept_and_a_bad_module_name_each_give_one_line(tmp_path):
    """`--data` before the program is clusterctl's: when it is not a shards directory the one-line error
    says so and how to give it to the program; a module name that cannot be one is refused before anything
    starts. Nothing is launched either way."""
    (tmp_path / "mydata").mkdir()
    r = clusterctl("run", "--data", "mydata", "train.py", "--steps", "2", timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: --data mydata: no manifest.json there. This --data is clusterctl's")
    assert r.stderr.strip().endswith("if it was meant for train.py, write it after train.py")
    for module in ("pkg/train", "my pkg", "pkg."):
        r = clusterctl("run", "-m", module, "train", timeout=60, cwd=tmp_path)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"-m {module!r} is not a module name" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()
