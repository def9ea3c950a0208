"""How much memory a rank of the bundled trainer needs, before anything is allocated: the model's shape, the
activations' terms and the measured coefficients each strategy's estimate is written with (strategies.py holds
the estimates, one per entry, and `choose`: which strategy fits the hosts, the refusal of a run that fits nowhere).

Pure arithmetic on the model's shape and the batch (no MLX import), so `clusterctl run` can plan on the
controller as the trainer does on each rank. The model is the bundled Transformer (model.py) in float32:

    P   parameters: vocab x dim (the tied embedding) + per block 4 dim^2 + 3 dim x mlp + 2 dim, + dim
    U   the largest unit zero3 gathers at once: one block, or the embedding matrix
    T   tokens per micro-batch on a rank: batch x block

Per rank, in bytes (the coefficients are measured peaks of MLX 0.32.4 on its CPU backend, `mx.get_peak_memory`,
at worlds 1, 2 and 4: benchmarks/bench_zero3.py checks them, docs/trainer.md#memory-planning has the table):

    dp      DP_PARAM x 4P                                   + activations of every block + the logits
    fsdp    (FSDP_FULL + FSDP_SHARD / N) x 4P               + FSDP_ACT x the same activations
            (FSDP_ONE x 4P at N = 1: the optimizer steps the full parameters)
    zero3   ZERO3_SHARD x 4P / N + ZERO3_UNITS x 4U         + each block's input + the recomputed block's
                                                              activations, forward and backward + the logits
    accum > 1 adds a running sum of the gradients: 4P (dp, fsdp) or 4P / N (zero3).

An adapter run (--adapter): the frozen base as stored (base_bytes: packed when quantized), the adapters with
their gradients and state (adapter_state), ADAPTER_ACT x the activations; under zero3 1/N of the base and
ZERO3_ADAPTER_UNITS spans of it whole (a span: consecutive units holding at most zero3_span() bytes (ZERO3_SPAN,
or an eighth of a small base), or one unit larger than that).

What counts against it is BUDGET of the smallest host's memory (macOS lets the GPU wire about that much by
default; the rest is the system's), or CLUSTERCTL_HOST_MEMORY where it is set (a test aid and an override:
"16G", "300M": this host has that much).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import BadInput
from ..trainer_contract import HOST_MEMORY

BYTES = 4                 # float32
BUDGET = 0.75

# measured (see the module docstring): peaks in units of 4P and 4U from the parameter-dominated
# model (4 layers, dim 384, mlp 1536, block 16, batch 2) at worlds 1, 2, 4; activations from an
# activation-heavy one (6 layers, dim 256, mlp 768, block 128, batch 8)
DP_PARAM = 7.0
FSDP_FULL, FSDP_SHARD = 3.86, 2.0
FSDP_ONE = 4.77             # a world of one: the optimizer steps the full parameters, no buckets
FSDP_ACT = 1.15             # its gradient step, compiled apart from the update, holds more at the peak
ZERO3_SHARD, ZERO3_UNITS = 3.5, 5.1
ACT_DIM, ACT_MLP, ACT_ATTN, ACT_LOGITS = 8.8, 2.93, 1.47, 3.0
ZERO3_ACT_BLOCKS = 2.5      # the block being recomputed: its forward's activations and its backward's
# an adapter run's activations against dp's formula: the backward through every frozen layer to the adapters
# below it holds more at its peak. Measured on an 8-block llama (dim 512, mlp 1536, batch 4, block 128), LoRA rank
# 8 on every block: 247 MB peak with a 4-bit base, 323 MB with a float32 one (MLX 0.32.4, CPU); the estimate
# with 1.4 gives 248 and 330 MB
ADAPTER_ACT = 1.4
# zero3 with adapters: the frozen base's spans held whole at once (the one computing, the next one prefetched,
# the last block's kept for the backward pass)
ZERO3_ADAPTER_UNITS = 3.0
# zero3 with adapters gathers the frozen base a span of consecutive units at a time, holding at most this many
# bytes (or one unit larger than that): a small unit's gather costs its latency, and on ring a waiting rank's polling
# (docs/facts/mlx-distributed.md#ring-waits-by-polling), not its bytes. Measured at world 4 on ring (4 ranks on
# 2 cores, a 16-block 4-bit base of 0.47 MB a block, LoRA on every block), a step's median time and the CPU over
# all ranks: a gather a unit (33 a step) 9.5 s, 19.1 s CPU, peak 20.7 MB; spans of 1 MiB (11 a step) 8.1 s, 15.5 s,
# 22.5 MB; 4 MiB (3 a step) 7.6 s, 14.9 s, 27.5 MB; dp 4.6 s, 9.0 s, 68.5 MB. 1 MiB: most of the speed, little memory
ZERO3_SPAN = 2**20
# ... and at most this share of the whole base: 3 spans held whole at once must stay a small part of a small base,
# or zero3 would save little memory over dp (a 5 MB base of 8 blocks: spans of one block, 0.6 MB)
ZERO3_SPAN_SHARE = 1 / 8


def zero3_span(base_bytes: float) -> int:
    """The bytes a span of zero3's frozen base closes at, for a base of `base_bytes`."""
    return int(min(ZERO3_SPAN, base_bytes * ZERO3_SPAN_SHARE))


class MemoryRefused(BadInput):
    """The run's estimate exceeds what the hosts have (exit 2: a change of flags or hosts fixes it)."""


@dataclass(frozen=True)
class Shape:
    vocab: int
    n_layers: int
    dim: int
    n_heads: int
    mlp_dim: int
    block_size: int
    batch_size: int
    accum: int = 1
    kv_dim: int | None = None       # keys' and values' width where it is not dim (grouped-query attention)
    tied: bool = True               # the output matrix is the embedding's
    q_dim: int | None = None        # queries' width (heads x head_dim) where it is not dim (qwen3)
    # an adapter run (--adapter): the adapters' parameter count, and the frozen base's bytes as trained (a
    # quantized base packed: bits / 8 a weight, with its groups' scales and biases)
    adapter_params: int = 0
    base_bytes: int = 0
    grad_checkpoint: bool = False   # --grad-checkpoint: a block keeps its input only, and is computed again
    # a fine-tune's packed rows may be wider than one record's, up to this many times the attention scores of
    # `batch_size` rows of `block_size` (data/records.py ATTENTION_ROOM); their positions never more
    attention_room: int = 1

    @classmethod
    def of(cls, config, vocab: int, model_config: dict | None = None, rows: tuple[int, int] | None = None) -> "Shape":
        """The bundled model's shape from the trainer's config, or with `model_config` (an mlx-lm model's
        config.json, --model) that model's, trained at the config's batch and block size, or with `rows` (a
        fine-tune's: at most this many rows of this width a micro-batch, its records' longest rounded up) at
        those."""
        if model_config is None:
            return cls(vocab, config.n_layers, config.dim, config.n_heads, config.mlp_dim, config.block_size,
                       config.batch_size, config.accum)
        m = {**model_config.get("text_config", {}), **model_config}
        dim, heads = int(m["hidden_size"]), int(m["num_attention_heads"])
        head_dim = int(m.get("head_dim") or dim // heads)
        batch, block = rows if rows else (config.batch_size, config.block_size)
        from ..data.records import ATTENTION_ROOM
        shape = cls(int(m["vocab_size"]), int(m["num_hidden_layers"]), dim, heads, int(m["intermediate_size"]),
                    block, batch, config.accum, grad_checkpoint=getattr(config, "grad_checkpoint", "off") == "on",
                    attention_room=ATTENTION_ROOM if rows else 1,
                    kv_dim=int(m.get("num_key_value_heads") or heads) * head_dim,
                    tied=bool(m.get("tie_word_embeddings", True)), q_dim=heads * head_dim)
        if not getattr(config, "adapter", None):
            return shape
        from dataclasses import replace
        from .adaptercount import blocks_adapted, count, lora_parameters

        params = lora_parameters(config)
        adapted = count(model_config, blocks_adapted(config, shape.n_layers), params["rank"], params.get("keys"))
        return replace(shape, adapter_params=adapted,
                       base_bytes=base_bytes(shape, model_config, 2 if config.precision == "bfloat16" else BYTES))

    @property
    def block_params(self) -> int:
        kv = self.dim if self.kv_dim is None else self.kv_dim
        q = self.dim if self.q_dim is None else self.q_dim
        return 2 * self.dim * q + 2 * self.dim * kv + 3 * self.dim * self.mlp_dim + 2 * self.dim

    @property
    def params(self) -> int:
        return (1 if self.tied else 2) * self.vocab * self.dim + self.n_layers * self.block_params + self.dim

    @property
    def largest_unit(self) -> int:
        return max(self.block_params, self.vocab * self.dim + self.dim)


@dataclass(frozen=True)
class Estimate:
    strategy: str
    world: int
    state: int            # parameters, gradients, optimizer state and the buffers around them
    activations: int

    @property
    def total(self) -> int:
        return self.state + self.activations


def base_bytes(shape: Shape, model_config: dict, float_bytes: int) -> int:
    """The frozen base of an adapter run in memory: its matrices packed as config.json's quantization says (bits
    / 8 bytes a weight, a scale and a bias of `float_bytes` per group: the trainer casts them to --precision, as
    every floating-point weight), or `float_bytes` a weight unquantized; the norms' vectors unquantized."""
    q = model_config.get("quantization") or {}
    norms = (2 * shape.n_layers + 1) * shape.dim
    matrices = shape.params - norms
    if isinstance(q, dict) and q.get("bits") and q.get("group_size"):
        per_weight = int(q["bits"]) / 8 + 2 * float_bytes / int(q["group_size"])
    else:
        per_weight = float_bytes
    return int(matrices * per_weight + norms * float_bytes)


def activations(shape: Shape) -> tuple[float, float]:
    """(per block, the logits) in bytes: what dp keeps for the backward pass."""
    tokens = shape.batch_size * shape.block_size
    per_block = BYTES * (tokens * (ACT_DIM * shape.dim + ACT_MLP * shape.mlp_dim)
                         + ACT_ATTN * shape.attention_room * shape.batch_size * shape.n_heads * shape.block_size ** 2)
    return per_block, BYTES * ACT_LOGITS * tokens * shape.vocab


def blocks_kept(shape: Shape, per_block: float) -> float:
    """What the blocks keep for the backward pass: every block's activations, or under --grad-checkpoint each
    block's input only (tokens x dim) and one block's activations while it is computed again."""
    if not shape.grad_checkpoint:
        return shape.n_layers * per_block
    return shape.n_layers * BYTES * shape.batch_size * shape.block_size * shape.dim + per_block


def adapter_state(shape: Shape) -> float:
    """An adapter run's adapters with their gradients and AdamW state, as dp's parameters are (and the running
    sum of the gradients under --accum)."""
    a4 = shape.adapter_params * BYTES
    return DP_PARAM * a4 + (shape.accum > 1) * a4


# An optimizer's state, in copies of the parameters it trains (mlx.optimizers: Adam's two moments; SGD's momentum
# and the others' one state at most, counted as one)
OPTIMIZER_SLOTS = {"adam": 2, "adamw": 2}


def checkpoint_bytes(shape: Shape, optimizer: str) -> int:
    """One checkpoint on a host's disk: the trained parameters (the adapters alone in an adapter run) and the
    optimizer's state for them, in float32 (each host ends with a whole one, whatever the strategy)."""
    trained = shape.adapter_params or shape.params
    return int(trained * BYTES * (1 + OPTIMIZER_SLOTS.get(optimizer, 1)))


def checkpoints_held(steps: int, every: int, keep: int) -> int:
    """The most checkpoints a run holds on a disk at once: those --keep keeps (0: every one it writes, one each
    --ckpt-every steps and the last) and, while one is written, that one beside them."""
    written = (steps // every if every else 0) + 1
    return min(keep + 1, written) if keep else written


def usable(host_bytes: int) -> int:
    return int(BUDGET * host_bytes)


def gb(n: float) -> str:
    if n >= 2 ** 30:
        return f"{n / 2 ** 30:.1f} GB"
    return f"{n / 2 ** 20:.0f} MB"


def parse_size(text: str) -> int:
    """'16G', '300M', '1.5T', '123456' (bytes) -> bytes; ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)[iI]?[bB]?\s*", text)
    if not m:
        raise ValueError(text)
    scale = {"": 1, "k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40}[m.group(2).lower()]
    value = float(m.group(1)) * scale
    if not value < 2 ** 60:          # a 400-digit number is a typo, not a host (float('1e400') is inf)
        raise ValueError(text)
    return int(value)


EXCHANGED = 2**20       # the ranks agree on the smallest host's memory in whole MiB (an int32 all_min)


def in_exchanged_units(size: int) -> int:
    """A host's memory as the ranks see it once exchanged: whole MiB, rounded down. The controller's early
    refusal (prelaunch.py) rounds the same way, so that it and the ranks refuse exactly the same runs."""
    return size // EXCHANGED


def host_memory() -> int | None:
    """This host's memory in bytes: CLUSTERCTL_HOST_MEMORY where set, else the physical memory (lowered to
    a cgroup's limit on Linux); None when the system does not say."""
    given = os.environ.get(HOST_MEMORY, "").strip()
    if given:
        try:
            return parse_size(given)
        except ValueError:
            raise BadInput(f"{HOST_MEMORY}={given!r}: a size such as 16G or 300M") from None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total
