"""What `serve` refuses on this machine before anything moves (serve/check.py): each in one line naming the
directory and the fix, with mlx-lm building the model lazily where it is installed (tests/lmfixture.py models)."""
import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lmfixture  # noqa: E402

from clusterctl.errors import ModelError  # noqa: E402
from clusterctl.serve.check import check_model, stage_files  # noqa: E402

pytest.importorskip("mlx_lm")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return lmfixture.make_model(tmp_path_factory.mktemp("m") / "tiny")


def copy(tiny, tmp_path, name="m"):
    return Path(shutil.copytree(tiny, tmp_path / name))


def refused(path, says, **kwargs):
    with pytest.raises(ModelError) as e:
        check_model(str(path), **{"world": 2, **kwargs})
    text = str(e.value)
    assert says in text and "\n" not in text, text
    assert e.value.exit_code == 2


def test_a_model_mlx_lm_can_build_and_shard_passes(tiny):
    summary = check_model(str(tiny), world=2)
    assert (summary.name, summary.kind, summary.deep) == ("tiny", "llama", True)
    assert summary.size == (tiny / "model.safetensors").stat().st_size


def test_what_is_not_a_model_directory_is_refused(tiny, tmp_path):
    refused(tmp_path / "none", "none: not a directory")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    refused(tmp_path / "data", "data is not an mlx-lm model directory: it has no config.json")
    m = copy(tiny, tmp_path, "badjson")
    (m / "config.json").write_text("{model_type: llama")
    refused(m, "config.json: not JSON")
    m = copy(tiny, tmp_path, "notype")
    (m / "config.json").write_text('{"hidden_size": 64}')
    refused(m, "config.json: no model_type")
    m = copy(tiny, tmp_path, "noweights")
    (m / "model.safetensors").unlink()
    refused(m, "noweights is not an mlx-lm model directory: it has no *.safetensors weights")
    m = copy(tiny, tmp_path, "notok")
    for f in m.glob("tokenizer*"):
        f.unlink()
    refused(m, "notok: no tokenizer")


def test_a_model_mlx_lm_cannot_load_is_refused(tiny, tmp_path):
    m = copy(tiny, tmp_path, "arch")
    config = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps({**config, "model_type": "no_such_arch"}))
    refused(m, "mlx-lm cannot load this no_such_arch model")
    m = copy(tiny, tmp_path, "shapes")
    (m / "config.json").write_text(json.dumps({**config, "hidden_size": 96}))       # weights of another size
    refused(m, "mlx-lm cannot load this llama model")


def test_pipeline_is_refused_for_a_model_mlx_lm_does_not_pipeline(tiny):
    # mlx-lm 0.32 pipelines deepseek, qwen3_next, ministral3 and a few more; llama only by tensor parallelism
    refused(tiny, "mlx-lm has no pipeline parallelism for llama: leave out --pipeline (it has tensor parallelism)",
            pipeline=True)
    assert check_model(str(tiny), world=1, pipeline=True).deep       # one host: nothing to split


def test_a_pipeline_stage_gets_only_the_weight_files_its_blocks_and_the_shared_weights_are_in(tmp_path):
    model = lmfixture.make_model(tmp_path / "q", "qwen2", layers=4, files=4)
    summary = check_model(str(model), world=2, pipeline=True)
    assert summary.layers == 4
    f = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    # rank 0 runs the last blocks (2, 3), rank 1 the first (0, 1); the embedding is in file 1, the norm and
    # the head in file 4: every stage reads those
    assert stage_files(str(model), 2, 4) == [[f[0], f[2], f[3]], [f[0], f[1], f[3]]]
    # 4 blocks on 3 stages: rank 0 takes two (the low ranks take the extra one), ranks 1 and 2 one each
    assert stage_files(str(model), 3, 4) == [[f[0], f[2], f[3]], [f[0], f[1], f[3]], [f[0], f[3]]]
    refused(model, "4 blocks cannot be split into 5 pipeline stages", world=5, pipeline=True)


def test_a_servers_failure_is_told_by_its_last_lines():
    from clusterctl.launch.outcome import Outcome
    from clusterctl.run.usecase import RunResult
    from clusterctl.serve.service import describe_failure

    def told(*tail):
        return describe_failure(RunResult(None, Outcome(1, "rank 0 on h1 exited 1", failed_rank=0, tail=list(tail))))

    assert told("Traceback (most recent call last):", "OSError: [Errno 98] Address already in use") == (
        "the server could not listen: its port is in use on rank 0's host (give another with --port)")
    assert told("  File \"mlx_lm/utils.py\", line 300, in load_model",
                "ValueError: Model type bogus not supported.") == (
        "the server could not load the model: ValueError: Model type bogus not supported.")
    assert told("something else went wrong") is None and told() is None
