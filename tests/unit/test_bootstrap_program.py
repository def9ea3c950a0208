"""The rank bootstrap as files (hosts/scripts/bootstrap.py and its pieces): the one program a rank receives is
composed from them with nothing left to import, the module (`python -m`) and the composed program run a rank
alike, and its pieces do their jobs when called directly."""
import ast
import json
import os
import subprocess
import sys

import pytest

from clusterctl.hosts import scripts
from clusterctl.hosts.scripts import bootstrap as boot
from clusterctl.hosts.scripts import program, script_text
from clusterctl.launch.bootstrap import BOOTSTRAP, MARK, parse_line

PIECES = ["tagged", "lines", "envfiles", "worldwatch", "awake", "nofile", "mpiworld"]


def test_the_program_is_self_contained_with_every_piece_once():
    tree = ast.parse(BOOTSTRAP)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {"." * node.level + (node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    for piece in PIECES:
        assert BOOTSTRAP.count(program(piece + ".py")) == 1, piece      # tagged.py with lines.py inlined in it
    assert BOOTSTRAP == program("bootstrap.py") and BOOTSTRAP.startswith(script_text("bootstrap.py")[:200])
    assert "class Lines" in BOOTSTRAP and BOOTSTRAP.index("class Lines") < BOOTSTRAP.index("class Tagged")


def test_program_inlines_only_siblings_and_leaves_other_imports_alone(tmp_path, monkeypatch):
    text = "from os import path\nfrom .lines import Lines\nfrom .lines import BAR_EVERY_S\nprint(path, Lines)\n"
    monkeypatch.setattr(scripts, "script_text", lambda name: text if name == "t.py" else script_text(name))
    composed = scripts.program.__wrapped__("t.py")
    assert composed.startswith("from os import path\n" + script_text("lines.py"))
    assert composed.count("class Lines") == 1 and "from .lines" not in composed


def _tagged(stdout: str) -> list[tuple[int, str, str]]:
    """The tagged lines but heartbeats and bar updates (their number depends on timing). Not splitlines():
    it splits at the mark's \\x1e too."""
    return [t for t in map(parse_line, stdout.split("\n")) if t is not None and t[1] not in ("hb", "bar")]


def _run_rank(argv_head: list[str], tmp_path, env_files: dict) -> subprocess.CompletedProcess:
    script = tmp_path / "prog.py"
    script.write_text("import os, sys\n"
                      "print('argv', *sys.argv[1:])\n"
                      "print('cwd', os.getcwd())\n"
                      "print('hostfile', open(os.environ['MLX_HOSTFILE']).read())\n"
                      "print('hostfile at', os.environ['MLX_HOSTFILE'])\n"
                      "print('run dir', os.environ['CLUSTERCTL_RUN_DIR'])\n"
                      "open(os.path.join(os.environ['CLUSTERCTL_RUN_DIR'], 'made'), 'w').close()\n"
                      "sys.stdout.write('50%\\r100%\\n')\n"
                      "print('oops', file=sys.stderr)\n"
                      "sys.exit(3)\n")
    (tmp_path / "wd" / "runs" / "x").mkdir(parents=True)
    env = {**os.environ, "CLUSTERCTL_ENV_FILES": json.dumps(env_files), "CLUSTERCTL_RUN_DIR": "runs/x",
           "MLX_RANK": "1"}
    env.pop("OMPI_COMM_WORLD_RANK", None)
    return subprocess.run([*argv_head, json.dumps(["/nowhere", str(tmp_path / "wd")]), "0.2", str(script), "a", "b c"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)


def test_the_module_and_the_composed_program_run_a_rank_alike(tmp_path):
    for how, head in (("module", [sys.executable, "-m", "clusterctl.hosts.scripts.bootstrap"]),
                      ("composed", [sys.executable, "-c", "#clusterctl-run-1-x\n" + BOOTSTRAP])):
        (tmp_path / how).mkdir()
        r = _run_rank(head, tmp_path / how, {"MLX_HOSTFILE": "[[\"h1\"]]"})
        assert r.returncode == 3 and r.stderr == "", (how, r)
        lines = _tagged(r.stdout)
        at = next(payload.split(" ", 2)[2] for _, kind, payload in lines if payload.startswith("hostfile at "))
        assert not os.path.exists(at)                                   # removed when the program ended
        lines = [line for line in lines if not line[2].startswith("hostfile at ")]
        assert lines[0][:2] == (1, "start") and lines[-1] == (1, "exit", "3 1"), (how, lines)
        assert sorted(lines[1:-1]) == sorted([
            (1, "out", "argv a b c"), (1, "out", f"cwd {tmp_path / how / 'wd'}"), (1, "out", 'hostfile [["h1"]]'),
            (1, "out", f"run dir {tmp_path / how / 'wd' / 'runs' / 'x'}"), (1, "out", "100%"), (1, "err", "oops")]), how
        assert all(line.startswith(MARK) for line in r.stdout.split("\n")[:-1])


def test_env_files_are_written_pointed_at_and_the_variable_consumed(monkeypatch):
    from clusterctl.hosts.scripts.envfiles import env_files

    monkeypatch.setenv("CLUSTERCTL_ENV_FILES", json.dumps({"MLX_HOSTFILE": "[]", "MLX_IBV_DEVICES": "[[null]]"}))
    monkeypatch.setenv("MLX_HOSTFILE", "before")            # restored after the test, as the files' variables
    monkeypatch.setenv("MLX_IBV_DEVICES", "before")
    made = env_files()
    try:
        assert "CLUSTERCTL_ENV_FILES" not in os.environ and sorted(made) == sorted(
            [os.environ["MLX_HOSTFILE"], os.environ["MLX_IBV_DEVICES"]])
        assert open(os.environ["MLX_IBV_DEVICES"]).read() == "[[null]]" and "mlx_hostfile" in os.environ["MLX_HOSTFILE"]
        assert oct(os.stat(made[0]).st_mode & 0o777) == "0o600"
    finally:
        for path in made:
            os.unlink(path)
    assert env_files() == []                                # nothing set: nothing written


@pytest.mark.parametrize("body, code, err", [
    ("pass", 0, ""), ("raise SystemExit(5)", 5, ""), ("raise SystemExit(None)", 0, ""),
    ("raise SystemExit('bad input')", 1, "bad input\n"), ("raise ValueError('boom')", 1, "ValueError: boom"),
])
def test_run_script_reports_the_exit_code_python_would(tmp_path, monkeypatch, capsys, body, code, err):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))            # run_script puts the script's place first
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(body + "\n")
    assert boot.run_script(str(tmp_path / "wd"), str(tmp_path / "s.py"), [], []) == code
    assert err in capsys.readouterr().err and os.getcwd() == str(tmp_path / "wd")


def test_run_script_runs_a_module_from_the_workdir_with_the_shipped_lib_first(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))            # run_script puts the script's place first
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".clusterctl" / "lib").mkdir(parents=True)
    (tmp_path / ".clusterctl" / "lib" / "shipped.py").write_text("WHERE = 'lib'\n")
    (tmp_path / "mod.py").write_text("import sys, shipped\nprint(__name__, sys.argv, shipped.WHERE)\n")
    monkeypatch.setenv("CLUSTERCTL_RESUME_DIR", "runs/old")
    assert boot.run_script(str(tmp_path), "-m", ["mod", "--x", "1"], []) == 0
    assert capsys.readouterr().out == f"__main__ {[str(tmp_path / 'mod.py'), '--x', '1']} lib\n"   # as python -m
    assert os.environ["CLUSTERCTL_RESUME_DIR"] == str(tmp_path / "runs" / "old")
    sys.modules.pop("mod", None)
    sys.modules.pop("shipped", None)


def test_left_files_is_whether_the_run_directory_holds_anything(tmp_path, monkeypatch):
    monkeypatch.delenv("CLUSTERCTL_RUN_DIR", raising=False)
    assert boot.left_files() is False
    monkeypatch.setenv("CLUSTERCTL_RUN_DIR", str(tmp_path))
    assert boot.left_files() is False
    (tmp_path / "metrics.jsonl").write_text("")
    assert boot.left_files() is True


def test_a_world_of_one_is_finalised_only_under_mpirun_np_1(monkeypatch):
    from clusterctl.hosts.scripts.mpiworld import finalize_world_of_one

    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    assert finalize_world_of_one() is None
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
    monkeypatch.setenv("MLX_MPI_LIBNAME", "libclusterctl-not-loaded.so")
    assert finalize_world_of_one() is None                  # no libmpi loaded in this process: nothing to finalise
