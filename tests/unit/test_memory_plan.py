"""The memory planner (clusterctl.train.memory's shapes, each strategy's estimate in clusterctl.train.strategies): the
estimate's arithmetic, what --strategy auto picks, and
the one-line refusal of a run that does not fit. Pure: the figures here are the formula's; how close the
formula is to measured peaks is tests/train/test_train_multiprocess.py's estimate test and
benchmarks/bench_zero3.py."""
import pytest

from clusterctl.errors import BadInput
from clusterctl.train import memory
from clusterctl.train.memory import MemoryRefused, Shape, parse_size
from clusterctl.train.prelaunch import plan_before_launch
from clusterctl.train.strategies import choose, estimate, names

# the issue's parameter-dominated model: 4 layers, dim 384, mlp 1536, block 16, batch 2, byte tokenizer
ISSUE = Shape(vocab=257, n_layers=4, dim=384, n_heads=4, mlp_dim=1536, block_size=16, batch_size=2)
MB = 2 ** 20


def test_parameter_count_is_the_bundled_models():
    block = 4 * 384 * 384 + 3 * 384 * 1536 + 2 * 384
    assert ISSUE.params == 257 * 384 + 4 * block + 384 == 9_539_328     # count_parameters of the model: 9.54M
    assert ISSUE.largest_unit == block


def test_sharding_shrinks_the_estimate_with_the_world_and_dp_does_not():
    dp = [estimate(ISSUE, "dp", n).total for n in (1, 2, 4)]
    fsdp = [estimate(ISSUE, "fsdp", n).total for n in (1, 2, 4)]
    zero3 = [estimate(ISSUE, "zero3", n).total for n in (1, 2, 4, 8)]
    assert dp[0] == dp[1] == dp[2]
    assert fsdp[1] > fsdp[2] and fsdp[0] < dp[0] and zero3 == sorted(zero3, reverse=True)
    assert zero3[2] < fsdp[2] < dp[2]
    assert zero3[2] / dp[2] < 0.4
    more = Shape(**{**ISSUE.__dict__, "accum": 2})       # a running sum of the gradients
    assert estimate(more, "dp", 1).total - dp[0] == ISSUE.params * 4


def test_auto_takes_the_cheapest_strategy_that_fits():
    dp, fsdp, zero3 = (estimate(ISSUE, s, 4).total for s in ("dp", "fsdp", "zero3"))
    host = lambda need: int(need / memory.BUDGET) + 1      # noqa: E731 — just enough memory for `need`
    assert choose(ISSUE, "auto", 4, host(dp)) == "dp"
    assert choose(ISSUE, "auto", 4, host(fsdp)) == "fsdp"
    assert choose(ISSUE, "auto", 4, host(zero3)) == "zero3"
    assert choose(ISSUE, "auto", 4, None) == "dp"           # nothing known of the hosts: the default
    assert choose(ISSUE, "zero3", 4, host(dp)) == "zero3"   # a strategy that fits is kept as given


def test_a_run_that_does_not_fit_is_refused_naming_what_fits():
    zero3 = estimate(ISSUE, "zero3", 4).total
    host = int(zero3 / memory.BUDGET) + MB
    with pytest.raises(MemoryRefused) as e:
        choose(ISSUE, "dp", 4, host)
    text = str(e.value)
    assert "\n" not in text and isinstance(e.value, BadInput)
    assert f"needs about {memory.gb(estimate(ISSUE, 'dp', 4).total)} per rank under dp at world 4" in text
    assert f"zero3 at world 4 needs {memory.gb(zero3)}: pass --strategy zero3" in text


def test_a_run_that_fits_nowhere_says_how_many_hosts_would_do():
    small = int(estimate(ISSUE, "zero3", 8).total / memory.BUDGET) + MB    # zero3 fits at 8, not at 4
    with pytest.raises(MemoryRefused, match="zero3 would fit on (5|6|7|8) such hosts"):
        choose(ISSUE, "auto", 4, small)
    with pytest.raises(MemoryRefused, match="no number of such hosts fits it"):
        choose(ISSUE, "zero3", 4, 10 * MB)


@pytest.mark.parametrize("text, value", [("16G", 16 * 2 ** 30), ("300M", 300 * MB), ("1.5g", int(1.5 * 2 ** 30)),
                                         ("2GiB", 2 * 2 ** 30), ("4096", 4096), ("512k", 512 * 1024)])
def test_sizes(text, value):
    assert parse_size(text) == value


def test_host_memory_reads_the_override_and_refuses_nonsense(monkeypatch):
    monkeypatch.setenv(memory.HOST_MEMORY, "300M")
    assert memory.host_memory() == 300 * MB
    monkeypatch.setenv(memory.HOST_MEMORY, "9" * 400)
    with pytest.raises(BadInput, match="a size such as 16G"):
        memory.host_memory()
    monkeypatch.setenv(memory.HOST_MEMORY, "lots")
    with pytest.raises(BadInput, match="CLUSTERCTL_HOST_MEMORY='lots': a size such as 16G"):
        memory.host_memory()
    monkeypatch.delenv(memory.HOST_MEMORY)
    assert memory.host_memory() > 100 * MB            # this machine's own


ARGS = ["--n-layers", "4", "--dim", "384", "--n-heads", "4", "--mlp-dim", "1536", "--block-size", "16",
        "--batch-size", "2"]


def test_run_refuses_on_the_controller_with_the_smallest_hosts_memory(tmp_path):
    check = plan_before_launch
    big, small = 16 * 2 ** 30, 200 * MB
    assert check(ARGS, 2, {"h1": big, "h2": big}, {}, "Linux", str(tmp_path)) == "dp"
    with pytest.raises(MemoryRefused, match="under dp at world 2; the smallest host has 200 MB .* pass --strategy zero3"):
        check(ARGS, 2, {"h1": big, "h2": small}, {}, "Linux", str(tmp_path))
    with pytest.raises(MemoryRefused):           # the inventory's env says so, whatever the probe found
        check(ARGS, 2, {"h1": big, "h2": big}, {"h2": "200M"}, "Linux", str(tmp_path))
    assert check([*ARGS, "--strategy", "auto"], 2, {"h1": small, "h2": small}, {}, "Linux", str(tmp_path)) == "zero3"
    assert check([*ARGS, "--memory-check", "off"], 2, {"h1": small}, {}, "Linux", str(tmp_path)) is None


def test_the_controller_rounds_a_hosts_memory_down_to_whole_mib_as_the_ranks_exchange_it(tmp_path):
    """The ranks agree on the smallest host in whole MiB (an int32 all_min); a host whose memory clears the need only
    by its bytes past the last whole MiB would be passed by the controller and then refused by every rank."""
    import math

    from clusterctl.train.config import resolve

    config, _ = resolve(list(ARGS), device="cpu")
    need = estimate(Shape.of(config, 257), "dp", 2).total
    by_bytes = math.ceil(need / memory.BUDGET)                   # the fewest bytes that fit, counted exactly
    while memory.usable(by_bytes) < need:
        by_bytes += 1
    assert by_bytes % MB and memory.usable(by_bytes // MB * MB) < need     # its whole MiB alone do not fit
    with pytest.raises(MemoryRefused, match="under dp at world 2"):
        plan_before_launch(ARGS, 2, {"h1": by_bytes}, {}, "Linux", str(tmp_path))
    whole = (by_bytes // MB + 1) * MB
    assert memory.in_exchanged_units(whole) * memory.EXCHANGED == whole
    assert plan_before_launch(ARGS, 2, {"h1": whole}, {}, "Linux", str(tmp_path)) == "dp"


def test_run_leaves_to_the_ranks_what_it_cannot_tell(tmp_path):
    check = plan_before_launch
    tiny = {"h1": 10 * MB}
    assert check([*ARGS, "--resume", "runs/x"], 1, tiny, {}, "Linux", str(tmp_path)) is None    # the checkpoint's settings
    assert check([*ARGS, "--dim", "385"], 1, tiny, {}, "Linux", str(tmp_path)) is None          # the trainer refuses it
    assert check([*ARGS, "--data", "nowhere"], 1, tiny, {}, "Linux", str(tmp_path)) is None     # vocabulary unknown
    assert check(ARGS, 1, {}, {}, "Linux", str(tmp_path)) is None                               # hosts unknown


# an 8-block llama of width 512 (the shape docs/finetune.md#lora-and-dora measured), as config.json says it
LLAMA = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 8, "intermediate_size": 1536,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 323, "tie_word_embeddings": False}


def adapter_shape(quantization=None, **flags):
    from clusterctl.train.config import TrainConfig

    config = TrainConfig(model="m", adapter="lora", batch_size=4, block_size=128, **flags)
    model_config = {**LLAMA, **({"quantization": quantization} if quantization else {})}
    return Shape.of(config, LLAMA["vocab_size"], model_config)


def test_an_adapter_run_counts_the_frozen_base_as_stored_and_the_adapters_alone_as_trained():
    float32, four_bit = adapter_shape(), adapter_shape({"bits": 4, "group_size": 64, "mode": "affine"})
    # rank 8 x (in + out) for q, k, v, o, gate, up, down of each of the 8 blocks
    assert float32.adapter_params == four_bit.adapter_params == 8 * 8 * (1024 + 768 + 768 + 1024 + 3 * 2048)
    assert four_bit.base_bytes < 0.2 * float32.base_bytes          # half a byte a weight, and the groups' scales
    assert adapter_shape(lora_layers=2).adapter_params == float32.adapter_params // 4
    assert adapter_shape(lora_keys="self_attn.q_proj,self_attn.v_proj").adapter_params == 8 * 8 * (1024 + 768)
    # the measured peaks (MB): 247 with the 4-bit base, 323 with the float32 one; the plan within 5 % of each
    for shape, peak in ((four_bit, 247), (float32, 323)):
        assert abs(estimate(shape, "dp", 1).total / MB - peak) < 0.05 * peak
    # a full fine-tune of the same model needs far more: its gradients and AdamW state are the model's size
    full = Shape.of(type("C", (), {"block_size": 128, "batch_size": 4, "accum": 1})(), 323, LLAMA)
    assert estimate(full, "dp", 1).total > 2 * estimate(float32, "dp", 1).total


def test_an_adapter_run_too_big_for_dp_is_refused_naming_zero3_which_shards_its_frozen_base():
    shape = adapter_shape({"bits": 4, "group_size": 64}, lora_rank=2, lora_keys="self_attn.q_proj")
    assert names() == ("dp", "fsdp", "zero3")
    dp, zero3 = estimate(shape, "dp", 4).total, estimate(shape, "zero3", 4).total
    assert zero3 < dp and estimate(shape, "zero3", 8).total < zero3       # 1/N of the base per rank
    host = int((dp + zero3) / 2 / memory.BUDGET)
    assert choose(shape, "auto", 4, host) == "zero3"
    with pytest.raises(MemoryRefused, match="under dp at world 4.* pass --strategy zero3"):
        choose(shape, "dp", 4, host)


def test_the_checkpoints_a_run_holds_at_once_and_their_size():
    from clusterctl.train.memory import checkpoint_bytes, checkpoints_held

    assert checkpoints_held(1000, 200, 3) == 4          # --keep 3, and one being written
    assert checkpoints_held(1000, 200, 0) == 6          # every one: steps 200..1000 and the last
    assert checkpoints_held(100, 200, 3) == 1           # only the last
    assert checkpoints_held(400, 0, 3) == 1             # --ckpt-every 0: the end only
    assert checkpoints_held(400, 200, 1) == 2
    shape = Shape(vocab=100, n_layers=1, dim=8, n_heads=2, mlp_dim=16, block_size=8, batch_size=2)
    assert checkpoint_bytes(shape, "adamw") == shape.params * 4 * 3        # the parameters and Adam's two moments
    assert checkpoint_bytes(shape, "sgd") == shape.params * 4 * 2
    from dataclasses import replace
    assert checkpoint_bytes(replace(shape, adapter_params=50), "adam") == 50 * 4 * 3     # an adapter run: its adapters
