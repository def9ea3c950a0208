"""A plain `pip install .` (not editable) into a fresh venv: the console script works and every template
in templates/ loads from the installed wheel, not from this source tree."""
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
    expected = sorted(f for f in os.listdir(os.path.join(REPO, "templates"))
                      if not f.endswith(".py") and not f.startswith("__"))
    probe = ("import json, clusterctl.resources as r, clusterctl.templates as t;"
             "print(json.dumps([t.__file__, r.template_names(), [len(r.template_text(n)) for n in r.template_names()]]))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    import json
    where, names, sizes = json.loads(out.stdout)
    assert where.startswith(str(venv)), where          # loaded from the installed wheel
    assert names == expected and all(sizes)
