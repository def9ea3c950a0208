"""`run` as a function (clusterctl/run/usecase.py), without click: the program it picks, a dry run, and real jobs
on this machine (two ranks, launched by the real launcher), recorded through RunEvents."""
import json
import os
import sys

import pytest

from clusterctl.errors import UsageError
from clusterctl.inventory import Cluster, parse
from clusterctl.launch import backends
from clusterctl.launch.attempts import AttemptSettings
from clusterctl.launch.stall import StallPolicy
from clusterctl.launch.outcome import Outcome
from clusterctl.launch.supervise import Settings
from clusterctl.program import Program
from clusterctl.run.events import RunEvents
from clusterctl.run.options import RunOptions
from clusterctl.run.resolve import program_for
from clusterctl.run.usecase import RunResult, run
from clusterctl.trainer_contract import TRAINER_MODULE as BUNDLED_TRAINER


def test_the_program_is_a_script_a_module_or_the_bundled_trainer():
    assert program_for("train.py", ("--lr", "1"), None) == Program("train.py", None, ("--lr", "1"))
    assert program_for(None, ("--steps", "5"), "pkg.tool") == Program(None, "pkg.tool", ("--steps", "5"))
    assert program_for(None, (), None) == Program(None, BUNDLED_TRAINER, ())
    # `run -- --steps 100`: click hands over "--steps" as the SCRIPT; it is the trainer's argument
    assert program_for("--steps", ("100",), None) == Program(None, BUNDLED_TRAINER, ("--steps", "100"))
    assert Program(None, "m", ("a",)).argv == ("-m", ["m", "a"]) and Program("s.py", None, ("a",)).argv == ("s.py", ["a"])
    with pytest.raises(UsageError, match="give a SCRIPT or --module, not both"):
        program_for("train.py", (), "pkg")


def test_the_ranks_arguments_are_built_from_named_parts():
    trainer, script = program_for(None, ("--steps", "5"), None), Program("s.py", None, ("a",))
    assert trainer.rank_args() == [BUNDLED_TRAINER, "--steps", "5"]
    # the shards run staged (or re-staged for a new world) go to the bundled trainer first, to no other program
    assert trainer.rank_args("/w/data") == [BUNDLED_TRAINER, "--data", "/w/data", "--steps", "5"]
    assert script.rank_args("/w/data") == ["a"] and Program(None, "m", ()).rank_args("/d") == ["m"]


def test_resume_latest_names_the_newest_run_here_with_a_checkpoint_as_its_ranks_find_it(tmp_path):
    """The bundled trainer's `--resume latest` (no --out) under run: every run has a directory of its own, so it is
    rewritten to the newest run in --runs-dir holding a checkpoint: runs/<id> on other hosts (relative to their
    workdir), this machine's own path when every rank runs here; none is one line, exit 2."""
    from clusterctl.run.resolve import resume_latest

    class Notes(RunEvents):
        def __init__(self):
            self.notes = []

        def note(self, text):
            self.notes.append(text)

    runs = tmp_path / "runs"
    here = Cluster.this_machine(str(tmp_path), slots=2, backend="ring")
    hosts = parse("hosts:\n  - name: h1\n    address: 10.0.0.1\n  - name: h2\n    address: 10.0.0.2\n", "inv.yaml")
    resume = program_for(None, ("--steps", "50", "--resume", "latest"), None)
    with pytest.raises(UsageError, match=r"^--resume latest: no run in .*runs/ holds a checkpoint"):
        resume_latest(resume, hosts, str(runs), Notes())
    (runs / "20261101-100000-aaaaaa" / "checkpoints" / "step-000012").mkdir(parents=True)
    (runs / "20261101-100000-aaaaaa" / "checkpoints" / "step-000012" / "state.json").write_text("{}")
    (runs / "20261102-100000-bbbbbb").mkdir()                      # newer, but stopped before any checkpoint
    notes = Notes()
    assert resume_latest(resume, hosts, str(runs), notes).args == ("--steps", "50", "--resume",
                                                                     "runs/20261101-100000-aaaaaa")
    assert notes.notes == ["--resume latest: run 20261101-100000-aaaaaa, from its step-000012 "
                           "(--resume runs/20261101-100000-aaaaaa)"]
    local = str(runs / "20261101-100000-aaaaaa")
    assert resume_latest(resume, here, str(runs), Notes()).args[-1] == local
    for same in (program_for(None, ("--resume", "latest", "--out", "mine"), None),
                 program_for(None, ("--resume", "runs/x"), None), Program("t.py", None, ("--resume", "latest"))):
        assert resume_latest(same, hosts, str(runs), Notes()) == same


def test_exit_codes_of_a_result():
    def result(code):
        return RunResult(None, Outcome(code, "x")).exit_code
    assert RunResult(None, None).exit_code == 0 and (result(0), result(3), result(130)) == (0, 3, 130)
    assert result(-9) == 1 and result(300) == 1     # a signal's negative status, or no shell status at all


class Recorder(RunEvents):
    def __init__(self):
        self.events = []

    def started(self, launch, program, world, backend):
        self.events.append(("started", program, world, backend))

    def output(self, text, is_err):
        self.events.append(("output", text))

    def staged(self, what, hosts, files, nbytes):
        self.events.append(("staged", what))

    @property
    def lines(self):
        return sorted(e[1] for e in self.events if e[0] == "output")


SCRIPT = """import os, sys
import mlx.core as mx
g = mx.distributed.init(backend=sys.argv[1], strict=True)
x = mx.distributed.all_sum(mx.array([g.rank() + 1.0]), group=g)
print(g.rank(), g.size(), x.item(), os.path.basename(os.getcwd()), flush=True)
sys.exit(int(sys.argv[2]) if g.rank() == 1 else 0)
"""


def _logs(run_dir):
    """Every log of a run, for a failing assertion's message (the run directory is gone by the time one reads it)."""
    return {n: open(os.path.join(run_dir, n), errors="replace").read()[-2000:]
            for n in sorted(os.listdir(run_dir)) if n.endswith(".log")}


def project(tmp_path):
    (tmp_path / "p").mkdir(exist_ok=True)
    (tmp_path / "p" / "job.py").write_text(SCRIPT)
    return str(tmp_path / "p")


def test_a_dry_run_describes_the_launch_and_starts_nothing(tmp_path):
    cluster = Cluster.this_machine(project(tmp_path), slots=2, backend="mpi")
    result = run(cluster, RunOptions(script="job.py", args=("mpi", "0"), project_dir=project(tmp_path),
                                     attempts=AttemptSettings(dry_run=True, preflight=False,
                                                              runs_dir=str(tmp_path / "runs"))))
    described = result.launch.describe()
    assert result.outcome is None and result.exit_code == 0
    assert described["rank_hosts"] == ["localhost", "localhost"] and described["backend"] == "mpi"
    assert described["rank_env"]["CLUSTERCTL_WORLD_SIZE"] == "2" and described["argv"][-3:] == ["job.py", "mpi", "0"]
    assert sorted(os.listdir(result.launch.run_dir)) == ["hostfile", "launch.json"]     # no rank ever started
    assert json.loads((tmp_path / "runs" / result.launch.run_id / "launch.json").read_text()) == described
    # what `clusterctl stacks RUN` reads back: where each host's ranks keep their pid and stacks files
    assert described["inventory"] is None
    assert described["rank_files"] == {"localhost": f"{project(tmp_path)}/.clusterctl/runs/{result.launch.run_id}"}
    assert "CLUSTERCTL_STALL" not in described["rank_env"]          # the watchdog is on by default
    # the run directory and launch.json hold the ranks' environment: private from the start (issue 25 item 1)
    assert os.stat(result.launch.run_dir).st_mode & 0o777 == 0o700
    assert os.stat(os.path.join(result.launch.run_dir, "launch.json")).st_mode & 0o777 == 0o600


def test_a_watchdog_turned_off_tells_the_ranks(tmp_path):
    cluster = Cluster.this_machine(project(tmp_path), slots=2, backend="mpi")
    result = run(cluster, RunOptions(script="job.py", project_dir=project(tmp_path),
                                     attempts=AttemptSettings(dry_run=True, preflight=False, runs_dir=str(tmp_path / "runs"),
                                                              watch=Settings(stall=StallPolicy.parse(0)))))
    assert result.launch.describe()["rank_env"]["CLUSTERCTL_STALL"] == "off"


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_a_job_on_this_machine_runs_every_rank_in_the_project(tmp_path, backend):
    if backends.get(backend).launcher_here() is None:
        pytest.skip(f"{backends.get(backend).launcher_name} is not installed here")
    events = Recorder()
    cluster = Cluster.this_machine(project(tmp_path), slots=2, backend=backend)
    result = run(cluster, RunOptions(script="job.py", args=(backend, "0"), project_dir=project(tmp_path),
                                     attempts=AttemptSettings(runs_dir=str(tmp_path / "runs"))), events)
    assert result.exit_code == 0, (result.outcome.reason, _logs(result.launch.run_dir))
    assert ("started", "job.py", 2, backend) in events.events
    assert events.lines == ["[rank 0 localhost] 0 2 3.0 p", "[rank 1 localhost] 1 2 3.0 p"]
    assert open(os.path.join(result.launch.run_dir, "rank-1.log")).read() == "1 2 3.0 p\n"


def test_an_error_in_the_first_attempt_still_writes_the_summary(tmp_path, monkeypatch):
    """Issue 25 item 5: the first attempt ran outside the record's try, so its crash left no summary.json."""
    from clusterctl.launch import attempts

    def broken(self, preflight=None, plan=None, copy=None):
        raise RuntimeError("the supervisor broke")

    monkeypatch.setattr(attempts.Supervisor, "run", broken)
    cluster = Cluster.this_machine(project(tmp_path), slots=2, backend="ring")
    with pytest.raises(RuntimeError):
        run(cluster, RunOptions(script="job.py", args=("ring", "0"), attempts=AttemptSettings(runs_dir=str(tmp_path / "runs")),
                                project_dir=project(tmp_path)), Recorder())
    [run_dir] = os.listdir(tmp_path / "runs")
    summary = json.loads((tmp_path / "runs" / run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 1 and summary["reason"] == "RuntimeError: the supervisor broke"


def test_a_failing_rank_fails_the_run_with_its_exit_code_and_last_lines(tmp_path):
    cluster = Cluster.this_machine(project(tmp_path), slots=2, backend="ring")
    result = run(cluster, RunOptions(script="job.py", args=("ring", "3"), project_dir=project(tmp_path),
                                     attempts=AttemptSettings(runs_dir=str(tmp_path / "runs"))), Recorder())
    assert result.exit_code == 3 and result.outcome.failed_rank == 1
    assert "rank 1 on localhost exited 3" in result.outcome.reason and result.outcome.tail == ["1 2 3.0 p"]


def test_no_launcher_anywhere_is_a_usage_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(backends.get("mpi"), "launcher_here", lambda: None)
    with pytest.raises(UsageError, match="mpirun is not installed here"):
        run(Cluster.this_machine(str(tmp_path), slots=2, backend="mpi"),
            RunOptions(script="job.py", attempts=AttemptSettings(preflight=False, dry_run=True, runs_dir=str(tmp_path / "runs"))))


def test_an_unknown_backend_is_bad_input_for_a_library_caller_too(tmp_path):
    """The registry refused it with a ValueError, which a caller's error boundary (the CLI's too) can only
    report as an internal error (exit 1): it is a UsageError (exit 2) naming the backends there are."""
    with pytest.raises(UsageError, match=r"^unknown backend 'nccl' \(one of mpi, ring, jaccl\)$") as info:
        run(Cluster.this_machine(str(tmp_path), slots=2, backend="mpi"),
            RunOptions(script="job.py", backend="nccl", attempts=AttemptSettings(dry_run=True, runs_dir=str(tmp_path / "runs"))))
    assert info.value.exit_code == 2 and not (tmp_path / "runs").exists()      # refused before anything


def test_an_inventory_cluster_runs_through_the_same_function(tmp_path):
    """`--hosts` with a local host: the inventory's slots and workdir, nothing of this machine's default."""
    where = project(tmp_path)
    cluster = parse(f"hosts: [{{name: box, local: true, slots: 3, workdir: {json.dumps(where)}}}]\n"
                    "launch: {backend: ring}\n", str(tmp_path / "inv.yaml"))
    events = Recorder()
    result = run(cluster, RunOptions(script="job.py", args=("ring", "0"),
                                     attempts=AttemptSettings(runs_dir=str(tmp_path / "runs"))), events)
    assert result.exit_code == 0 and [line.split()[:4] for line in events.lines] == \
        [["[rank", "0", "box]", "0"], ["[rank", "1", "box]", "1"], ["[rank", "2", "box]", "2"]]
    assert sys.executable == cluster.hosts[0].python
