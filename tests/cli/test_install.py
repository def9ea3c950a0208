"""A plain `pip install .` (not editable) into a fresh venv: the console script works and every template
in templates/ loads from the installed wheel, not from this source tree."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_wheel_install_in_a_fresh_venv_has_the_cli_and_every_template(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", REPO], capture_output=True, text=True,
                         timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    version = subprocess.run([str(venv / "bin" / "clusterctl"), "--version"], capture_output=True, text=True,
                             cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("clusterctl "), version.stderr
    # the version is written once (clusterctl/_version.py): the wheel's metadata says the same
    meta = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('clusterctl'))"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert version.stdout.split()[-1] == meta.stdout.strip() != "", (version.stdout, meta.stdout, meta.stderr)
    expected = sorted(f for f in os.listdir(os.path.join(REPO, "templates"))
                      if not f.endswith(".py") and not f.startswith("__"))
    probe = ("import json, clusterctl.resources as r, clusterctl.templates as t;"
             "print(json.dumps([t.__file__, r.template_names(), [len(r.template_text(n)) for n in r.template_names()]]))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    where, names, sizes = json.loads(out.stdout)
    assert where.startswith(str(venv)), where          # loaded from the installed wheel
    assert names == expected and all(sizes)
    # every module of the source tree is in the wheel and imports from it
    modules = sorted(os.path.relpath(os.path.join(d, f), REPO)[:-3].replace(os.sep, ".")
                     for d, _, files in os.walk(os.path.join(REPO, "clusterctl")) for f in files
                     if f.endswith(".py") and not f.startswith("__main__"))
    modules = [m[: -len(".__init__")] if m.endswith(".__init__") else m for m in modules]
    probe = ("import importlib, json, sys; mods = json.loads(sys.argv[1]); "
             "print(json.dumps([importlib.import_module(m).__file__ for m in mods]))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe, json.dumps(modules)], capture_output=True,
                         text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert all(f.startswith(str(venv)) for f in json.loads(out.stdout))
    assert "clusterctl.doctor.checks" in modules and len(modules) > 15
    doctor = subprocess.run([str(venv / "bin" / "clusterctl"), "doctor", "--no-deep", "--hosts",
                             os.path.join(REPO, "inventory", "local.yaml")], capture_output=True, text=True, cwd=tmp_path)
    assert doctor.returncode == 0 and "Traceback" not in doctor.stderr, doctor.stdout + doctor.stderr
