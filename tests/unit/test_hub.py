"""Models named by their Hugging Face id (transfer/hub.py): which words are ids, and resolving one against a cache
seeded in the hub's own layout (tests/lmfixture.hub_snapshot), the hub offline: nothing is downloaded."""
import os
import subprocess
import sys

import pytest

from clusterctl.transfer.hub import hub_id

pytest.importorskip("huggingface_hub")
HERE = os.path.dirname(os.path.abspath(__file__))


def test_an_id_is_org_slash_name_and_never_a_path_that_exists_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub_id("mlx-community/Qwen3-4B-4bit") == ("mlx-community/Qwen3-4B-4bit", None)
    assert hub_id("org/name@v1.0") == ("org/name", "v1.0")
    (tmp_path / "models" / "mine").mkdir(parents=True)
    assert hub_id("models/mine", base="/nowhere") == ("models/mine", None)      # a path, relative to another base
    for word in ("models/mine", "./x/y", "/abs/path", "~/m/n", "a/b/c", "name", "../up/x", "org/..", "a b/c", ""):
        assert hub_id(word) is None, word


def resolve_in(env: dict, word: str) -> subprocess.CompletedProcess:
    """resolve() in a fresh process: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when it is imported."""
    code = ("import sys\nfrom clusterctl.errors import ModelError\nfrom clusterctl.transfer.hub import resolve\n"
            "try:\n    print(resolve(sys.argv[1]))\nexcept ModelError as e:\n    sys.exit(f'error: {e}')\n")
    return subprocess.run([sys.executable, "-c", code, word], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env}, cwd=env["HF_HOME"])


def test_an_id_in_the_cache_is_its_snapshot_and_one_it_lacks_offline_is_one_line(tmp_path):
    sys.path.insert(0, os.path.dirname(HERE))
    import lmfixture

    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"w" * 64)
    snap = lmfixture.hub_snapshot(model, tmp_path / "hf", "mlx-community/Tiny-4bit")
    offline = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    r = resolve_in(offline, "mlx-community/Tiny-4bit")
    assert r.returncode == 0 and r.stdout.strip() == str(snap), r.stderr
    r = resolve_in(offline, "mlx-community/Tiny-4bit@" + "0" * 40)         # a revision the cache holds
    assert r.returncode == 0 and r.stdout.strip() == str(snap), r.stderr
    r = resolve_in(offline, "mlx-community/Absent")
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"error: mlx-community/Absent: no such directory here, and not in the Hugging Face cache here "
        f"({tmp_path / 'hf' / 'hub'}) while HF_HUB_OFFLINE is set: unset it to download the model once, or give a "
        "model directory"], r.stderr
    r = resolve_in(offline, "tiny")                                      # a directory here: left as it is
    assert r.returncode == 0 and r.stdout.strip() == "tiny"
