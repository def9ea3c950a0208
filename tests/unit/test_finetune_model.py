"""`--model DIR` refused in one line for what the ranks cannot use, checked before anything loads (train/lm.py);
and export.py: a from-scratch checkpoint as an mlx-lm llama whose logits and tokens are the bundled model's."""
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mlx_lm")

import lmfixture  # noqa: E402

from clusterctl.errors import ConfigError, MissingExtra  # noqa: E402
from clusterctl.train import lm  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return lmfixture.make_model(tmp_path_factory.mktemp("m") / "llama")


def copy(model_dir, tmp_path):
    dest = tmp_path / "m"
    shutil.copytree(model_dir, dest)
    return dest


def test_a_good_directory_passes_and_names_its_architecture(model_dir):
    config = lm.check_model_dir(str(model_dir))
    assert config["model_type"] == "llama" and lm.architecture(config, str(model_dir)) == "llama"
    assert lm.vocab_size(config) == config["vocab_size"]


@pytest.mark.parametrize("damage, says", [
    (lambda d: shutil.rmtree(d), "no such directory"),
    (lambda d: (d / "config.json").unlink(), "not an mlx-lm model directory (no config.json)"),
    (lambda d: (d / "config.json").write_text("{"), "config.json: not readable JSON"),
    (lambda d: (d / "config.json").write_text('{"hidden_size": 8}'), "no model_type"),
    (lambda d: [p.unlink() for p in d.glob("model*.safetensors")], "no model*.safetensors weights"),
    (lambda d: [(d / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")], "no tokenizer"),
    (lambda d: (d / "config.json").write_text('{"model_type": "no_such_arch"}'),
     "has no architecture 'no_such_arch' (a newer mlx-lm may: pip install -U mlx-lm)"),
])
def test_what_is_not_an_mlx_lm_model_is_one_line(model_dir, tmp_path, damage, says):
    d = copy(model_dir, tmp_path)
    damage(d)
    with pytest.raises(ConfigError) as e:
        lm.check_model_dir(str(d))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_without_mlx_lm_the_error_names_the_install_command(monkeypatch, model_dir):
    monkeypatch.setattr(lm.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingExtra) as e:
        lm.check_model_dir(str(model_dir))
    assert "--model needs mlx-lm, which is not installed in" in str(e.value)
    assert "pip install mlx-lm" in str(e.value)


def test_a_quantized_model_is_refused_with_the_command_that_makes_a_copy_it_trains(model_dir, tmp_path):
    """Issue 45: the refusal said to train from the original, which a user holding only the quantized download
    does not have. Now it names adapters (which train on it as it is) and mlx-lm's own dequantizing command, and
    that command, run as printed, makes a directory a full fine-tune takes."""
    import shlex

    d = tmp_path / "my model"
    convert = os.path.join(os.path.dirname(sys.executable), "mlx_lm.convert")
    made = subprocess.run([convert, "--hf-path", str(model_dir), "--mlx-path", str(d), "-q", "--q-group-size", "32"],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    with pytest.raises(ConfigError) as e:
        lm.check_model_dir(str(d))
    message = str(e.value)
    assert "the weights are quantized (4-bit affine, groups of 32)" in message and "--adapter lora" in message
    assert lm.check_model_dir(str(d), "lora")["model_type"] == "llama"      # adapters train on it as it is
    command = shlex.split(message.split("`")[1])
    assert command[0] == "mlx_lm.convert" and "\n" not in message
    undone = subprocess.run([convert, *command[1:]], capture_output=True, text=True, timeout=300)
    assert undone.returncode == 0, undone.stderr
    assert lm.check_model_dir(str(tmp_path / "my model-dequantized"))["model_type"] == "llama"


def test_weights_dtype_is_read_from_the_safetensors_header(tmp_path):
    assert lm.weights_dtype(str(lmfixture.make_model(tmp_path / "bf", dtype="bfloat16"))) == "bfloat16"
    assert lm.weights_dtype(str(lmfixture.make_model(tmp_path / "f32"))) == "float32"


def test_the_byte_tokenizer_as_a_tokenizer_json_gives_the_same_ids():
    from tokenizers import Tokenizer

    from clusterctl.data.tokenizer import ByteTokenizer
    from clusterctl.train.export import byte_tokenizer_json

    tok = Tokenizer.from_str(json.dumps(byte_tokenizer_json()))
    ours = ByteTokenizer()
    for text in ["Once upon a time", "  two  spaces\nand a newline\t", "café ☕ 日本", "\x00\x7f"]:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids == ours.encode(text) and tok.decode(ids) == text
    assert tok.token_to_id("<|endoftext|>") == ours.eos_id


def test_a_model_trained_from_scratch_exports_as_a_llama_with_the_same_logits(tmp_path):
    import mlx.core as mx
    from mlx_lm import load

    from clusterctl.train.export import export
    from clusterctl.train.generate import load as load_ours

    out = tmp_path / "run"
    # a process of its own: MLX's distributed init in this one would leave an MPI singleton that breaks mpirun
    r = subprocess.run([sys.executable, "-m", "clusterctl.train", "--preset", "tiny", "--steps", "2", "--eval-every",
                        "0", "--out", str(out)], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if not k.startswith("CLUSTERCTL_")})
    assert r.returncode == 0, r.stderr
    path = export(str(out), str(out / "model"))
    model, tokenizer = load(str(path))
    ours, our_tok, _ = load_ours(str(out))
    text = "Once upon a time, café"
    ids = our_tok.encode(text)
    assert tokenizer.encode(text) == ids and tokenizer.eos_token_id == our_tok.eos_id
    x = mx.array(ids)[None]
    assert mx.allclose(model(x), ours(x), atol=1e-5).item()
    (out / "model" / "stale").write_text("from before")      # a second export replaces the directory whole
    export(str(out), str(out / "model"))
    assert not (out / "model" / "stale").exists()
    elsewhere = tmp_path / "notes"
    elsewhere.mkdir()
    (elsewhere / "todo.txt").write_text("mine")
    with pytest.raises(Exception, match="holds files no export wrote"):
        export(str(out), str(elsewhere))
    assert (elsewhere / "todo.txt").read_text() == "mine"


def test_a_large_model_is_written_in_files_of_at_most_the_limit_with_an_index_mlx_lm_reads(monkeypatch, tmp_path):
    import mlx.core as mx
    from mlx_lm import load

    from clusterctl.train import export

    src = lmfixture.make_model(tmp_path / "src")
    weights = mx.load(str(src / "model.safetensors"))
    monkeypatch.setattr(export, "MAX_FILE_BYTES", 100_000)          # the fixture's 0.46 MB in several files
    dest = tmp_path / "out"
    dest.mkdir()
    names = export.write_weights(weights, dest)
    assert len(names) > 2 and names[0] == f"model-00001-of-{len(names):05d}.safetensors"
    assert all((dest / n).stat().st_size <= 100_000 + 4096 for n in names)      # + the file's header
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(weights) and set(index["weight_map"].values()) == set(names)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dest / name)
    model, _ = load(str(dest))
    x = mx.array([[1, 2, 3, 4]])
    reference, _ = load(str(src))
    assert mx.allclose(model(x), reference(x)).item()
