"""Packed rows with per-record attention (train/packing.py, data/records.py): a packed batch computes what the same
records padded compute, record by record (losses, gradients, one optimizer step); a model that would not is found;
and the test score is mlx-lm's (`mlx_lm.lora --test`'s evaluate), with and without its extra padding target."""
import types

import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

import lmfixture  # noqa: E402
from clusterctl.data import records  # noqa: E402
from clusterctl.train import packing  # noqa: E402
from clusterctl.train.model import loss_fn  # noqa: E402

SEQS = [([5, 6, 7, 8, 9, 10, 11, 12], 3), ([20, 21, 22, 23, 24], 0), ([30, 31, 32, 33, 34, 35, 36, 37, 38, 39], 4),
        ([40, 41, 42], 0)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from pathlib import Path

    from mlx_lm.utils import load_model

    root = tmp_path_factory.mktemp("packing")
    out = {}
    for kind in ("llama", "qwen3"):
        out[kind] = load_model(Path(lmfixture.make_model(root / kind, kind)))[0]
    q4 = lmfixture.quantize(root / "llama", root / "llama-4bit", bits=4, group_size=32)
    out["llama-4bit-lora"] = load_model(Path(q4))[0]
    from clusterctl.train import adapters

    mx.random.seed(0)
    config = types.SimpleNamespace(adapter="lora", lora_rank=4, lora_scale=20.0, lora_dropout=0.0, lora_layers=-1,
                                   lora_keys=None, model="m")
    adapters.apply(out["llama-4bit-lora"], config)
    mx.eval(out["llama-4bit-lora"].parameters())
    return out


def per_record(logits, y, segments):
    """Each record's summed loss and target count, in segment order of each row."""
    ce = nn.losses.cross_entropy(logits.astype(mx.float32), mx.maximum(y, 0)) * (y >= 0)
    out = []
    for r in range(y.shape[0]):
        for s in sorted({v for v in segments[r].tolist() if v >= 0}):
            mine = (segments[r] == s) & (y[r] >= 0)
            out.append((float((ce[r] * mine).sum().item()), int(mine.sum().item())))
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen3", "llama-4bit-lora"])
def test_a_packed_batch_computes_each_record_as_the_same_records_padded(models, kind):
    model = models[kind]
    sequences = [records.pairs(ids, offset) for ids, offset in SEQS]
    packed = records.pack(sequences, filler=0)
    padded = records.pack(sequences, filler=0, together=False)
    assert packed.shape[0] < padded.shape[0]            # the point of packing: fewer rows
    px, py, ps = (mx.array(a) for a in (packed.tokens, packed.labels, packed.segments))
    dx, dy, ds = (mx.array(a) for a in (padded.tokens, padded.labels, padded.segments))
    # each record's loss (the records have 5, 4, 6 and 2 trained targets: matched by their counts)
    got = sorted(per_record(packing.forward(model, px, ps), py, ps), key=lambda t: t[1])
    want = sorted(per_record(model(dx), dy, ds), key=lambda t: t[1])
    assert [n for _, n in got] == [n for _, n in want] == [2, 4, 5, 6]
    for (a, _), (b, _) in zip(got, want):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-4)
    # the batch's loss and its gradients: the trainer's loss_fn, packed (segments) against padded (the model's own mask)
    loss_packed, g_packed = nn.value_and_grad(model, loss_fn)(model, px, py, ps)
    loss_padded, g_padded = nn.value_and_grad(model, loss_fn)(model, dx, dy)
    assert loss_packed.item() == pytest.approx(loss_padded.item(), rel=1e-6)
    flat_p, flat_d = dict(tree_flatten(g_packed)), dict(tree_flatten(g_padded))
    assert flat_p.keys() == flat_d.keys() and flat_p
    for k in flat_p:
        assert mx.allclose(flat_p[k], flat_d[k], rtol=1e-4, atol=1e-6).item(), k
    # and with the head computed at the trained positions alone (the loader's picks): the same loss and gradients
    assert packing.splits_exactly(model, 300)
    [picks] = records.trained_positions([packed.labels])
    assert len(picks) % records.PICK_MULTIPLE == 0 and sum(p >= 0 for p in picks) == 2 + 4 + 5 + 6
    loss_picked, g_picked = nn.value_and_grad(model, loss_fn)(model, px, py, ps, mx.array(picks))
    assert loss_picked.item() == pytest.approx(loss_padded.item(), rel=1e-6)
    for k, g in tree_flatten(g_picked):
        assert mx.allclose(g, flat_d[k], rtol=1e-4, atol=1e-6).item(), k


def test_one_optimizer_step_on_packed_rows_equals_it_on_padded_rows(tmp_path):
    from pathlib import Path

    from mlx_lm.utils import load_model

    from clusterctl.train.step import make_dp_step

    config = types.SimpleNamespace(max_norm=0.0, accum=1)
    sequences = [records.pairs(ids, offset) for ids, offset in SEQS]
    results = []
    # padded; packed; packed with the head at the trained positions alone
    for together, picks in ((False, False), (True, False), (True, True)):
        model = load_model(Path(lmfixture.make_model(tmp_path / "m", "llama")))[0]
        import mlx.optimizers as optim

        step = make_dp_step(model, optim.SGD(0.5), config, mx.distributed.init(backend="ring"))   # linear in the gradients
        rows = records.pack(sequences, filler=0, together=together)
        batch = records.stack([rows], 0, segments=together, picks=picks)
        assert len(batch) == 2 + together + picks
        loss, _ = step(*batch)
        mx.eval(model.parameters())
        results.append((loss.item(), dict(tree_flatten(model.parameters()))))
    (la, pa), *others = results
    for lb, pb in others:
        assert la == pytest.approx(lb, rel=1e-6)
        for k in pa:
            assert mx.allclose(pa[k], pb[k], rtol=1e-5, atol=1e-6).item(), k


def test_a_model_with_absolute_positions_is_found_not_to_pack(tmp_path):
    from mlx_lm.models import gpt2

    args = gpt2.ModelArgs(model_type="gpt2", n_ctx=64, n_embd=32, n_head=2, n_layer=1, n_positions=64,
                          layer_norm_epsilon=1e-5, vocab_size=50)
    model = gpt2.Model(args)
    mx.eval(model.parameters())
    assert not packing.packs_exactly(model, 50)


def test_rotary_models_pack_exactly(models):
    assert all(packing.packs_exactly(models[k], 300) for k in models)


def test_a_model_that_scales_its_logits_is_found_not_to_split(models):
    """The head at the trained positions alone needs output_layer(hidden(x)) to be the model's output: a model that
    computes more after its head (here: logits doubled, as gemma's caps or cohere's scale change them) is found."""
    class Scaled(type(models["llama"])):
        def __call__(self, *args, **kwargs):
            return 2 * super().__call__(*args, **kwargs)

    model = models["llama"]
    scaled = Scaled(model.args)
    scaled.update(model.parameters())
    assert packing.splits_exactly(model, 300) and not packing.splits_exactly(scaled, 300)


def test_our_test_score_is_mlx_lm_s_evaluate_with_and_without_its_padding_target(tmp_path, models, monkeypatch):
    """`mlx_lm.lora --test` runs mlx_lm.tuner.trainer.evaluate with default_loss, which also scores the padding token
    after each record; ours leaves it out. Scored with that target added (HeldOut's pad_target), ours equals it;
    without it, ours equals mlx-lm's evaluate with the padding target masked out."""
    from mlx_lm.tuner.datasets import CacheDataset, load_dataset
    from mlx_lm.tuner.trainer import default_loss, evaluate as mlx_lm_evaluate
    from mlx_lm.utils import load_tokenizer

    from clusterctl.train.testset import evaluate

    model_dir = lmfixture.make_model(tmp_path / "m", "llama")
    model = models["llama"]
    data = lmfixture.make_data(tmp_path / "d", "chat", records=40)
    (data / "test.jsonl").write_text((data / "valid.jsonl").read_text() * 3)        # 12 records: whole batches of 4
    tokenizer = load_tokenizer(model_dir)
    group = mx.distributed.init(backend="ring")       # a world of one without MPI (tests/conftest.py)
    # mlx-lm's evaluate calls init() and all_sum on the default group: both on this world of one
    all_sum = mx.distributed.all_sum
    monkeypatch.setattr(mx.distributed, "init", lambda *a, **k: group)
    monkeypatch.setattr(mx.distributed, "all_sum", lambda x, **k: all_sum(x, **{**k, "group": group}))
    for mask in (True, False):
        args = types.SimpleNamespace(data=str(data), mask_prompt=mask, train=False, test=True, hf_dataset=None)
        test = CacheDataset(load_dataset(args, tokenizer)[2])

        def without_pad(model, batch, lengths):
            targets = batch[:, 1:]
            steps = mx.arange(1, targets.shape[1] + 1)
            keep = (steps >= lengths[:, 0:1]) & (steps < lengths[:, 1:])
            ce = nn.losses.cross_entropy(model(batch[:, :-1]), targets) * keep
            return ce.astype(mx.float32).sum() / keep.sum(), keep.sum()

        theirs = mlx_lm_evaluate(model, test, 4, -1, 2048, loss=default_loss)
        theirs_without = mlx_lm_evaluate(model, test, 4, -1, 2048, loss=without_pad)
        seqs = records.tokenize_all(records.read_records(str(data / "test.jsonl")), tokenizer, mask, 2048)
        ours_quirk = evaluate(model, records.HeldOut(seqs, 4, 1, 0, tokenizer.eos_token_id, pad_target=0), -1, group,
                              loss_fn)
        ours = evaluate(model, records.HeldOut(seqs, 4, 1, 0, tokenizer.eos_token_id), -1, group, loss_fn)
        assert ours_quirk == pytest.approx(theirs, abs=1e-3)
        assert ours == pytest.approx(theirs_without, abs=1e-3)
        assert abs(ours - theirs) > 1e-3           # the two definitions differ: the comparison is not vacuous
