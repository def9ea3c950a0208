"""How much memory a rank of the bundled trainer needs, per strategy, before anything is allocated; which
strategy fits the hosts (`--strategy auto`); the refusal of a run that fits nowhere, with the numbers.

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
ORDER = ("dp", "fsdp", "zero3")     # cheapest (least communication) first: what auto tries in turn

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
# zero3 with adapters: the frozen base's units held whole at once (the one computing, the next one prefetched,
# the last block's kept for the backward pass)
ZERO3_ADAPTER_UNITS = 3.0


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

    @classmethod
    def of(cls, config, vocab: int, model_config: dict | None = None) -> "Shape":
        """The bundled model's shape from the trainer's config, or with `model_config` (an mlx-lm model's
        config.json, --model) that model's, trained at the config's batch and block size."""
        if model_config is None:
            return cls(vocab, config.n_layers, config.dim, config.n_heads, config.mlp_dim, config.block_size,
                       config.batch_size, config.accum)
        m = {**model_config.get("text_config", {}), **model_config}
        dim, heads = int(m["hidden_size"]), int(m["num_attention_heads"])
        head_dim = int(m.get("head_dim") or dim // heads)
        shape = cls(int(m["vocab_size"]), int(m["num_hidden_layers"]), dim, heads, int(m["intermediate_size"]),
                    config.block_size, config.batch_size, config.accum,
                    kv_dim=int(m.get("num_key_value_heads") or heads) * head_dim,
                    tied=bool(m.get("tie_word_embeddings", True)), q_dim=heads * head_dim)
        if not getattr(config, "adapter", None):
            return shape
        from dataclasses import replace
        from .adapters import blocks_adapted, count, lora_parameters

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


def strategies(shape: Shape) -> tuple[str, ...]:
    """What --strategy auto tries for this run, in turn."""
    return ORDER


def estimate(shape: Shape, strategy: str, world: int) -> Estimate:
    if shape.adapter_params:
        return _adapter_estimate(shape, strategy, world)
    p4, u4 = shape.params * BYTES, shape.largest_unit * BYTES
    tokens = shape.batch_size * shape.block_size
    per_block = BYTES * (tokens * (ACT_DIM * shape.dim + ACT_MLP * shape.mlp_dim)
                         + ACT_ATTN * shape.batch_size * shape.n_heads * shape.block_size ** 2)
    logits = BYTES * ACT_LOGITS * tokens * shape.vocab
    running = shape.accum > 1
    if strategy == "dp":
        state = DP_PARAM * p4 + running * p4
        act = shape.n_layers * per_block + logits
    elif strategy == "fsdp":
        state = (FSDP_ONE if world == 1 else FSDP_FULL + FSDP_SHARD / world) * p4 + running * p4
        act = FSDP_ACT * (shape.n_layers * per_block + logits)
    elif strategy == "zero3":
        state = ZERO3_SHARD * p4 / world + ZERO3_UNITS * u4 + running * p4 / world
        act = shape.n_layers * BYTES * tokens * shape.dim + ZERO3_ACT_BLOCKS * per_block + logits
    else:
        raise ValueError(f"no estimate for strategy {strategy!r}")
    return Estimate(strategy, world, int(state), int(act))


def _activations(shape: Shape) -> tuple[float, float]:
    """(per block, the logits) in bytes: what dp keeps for the backward pass."""
    tokens = shape.batch_size * shape.block_size
    per_block = BYTES * (tokens * (ACT_DIM * shape.dim + ACT_MLP * shape.mlp_dim)
                         + ACT_ATTN * shape.batch_size * shape.n_heads * shape.block_size ** 2)
    return per_block, BYTES * ACT_LOGITS * tokens * shape.vocab


def _adapter_estimate(shape: Shape, strategy: str, world: int) -> Estimate:
    """An adapter run: the frozen base once (no gradient, no optimizer state), the adapters with their gradients
    and AdamW state as dp's parameters are (fsdp shards that state: it is small either way), and the activations
    of every block, which the adapters' gradients still need."""
    if strategy not in ORDER:
        raise ValueError(f"no estimate for an adapter run under {strategy!r}")
    a4 = shape.adapter_params * BYTES
    per_block, logits = _activations(shape)
    adapters = DP_PARAM * a4 + (shape.accum > 1) * a4
    if strategy == "zero3":     # 1/N of the base, a few units' base whole while they compute, zero3's activations
        unit = shape.base_bytes * shape.largest_unit / shape.params
        state = shape.base_bytes / world + ZERO3_ADAPTER_UNITS * unit + adapters
        act = ADAPTER_ACT * (shape.n_layers * BYTES * shape.batch_size * shape.block_size * shape.dim
                             + ZERO3_ACT_BLOCKS * per_block + logits)
        return Estimate(strategy, world, int(state), int(act))
    state = shape.base_bytes + adapters
    act = ADAPTER_ACT * (FSDP_ACT if strategy == "fsdp" else 1.0) * (shape.n_layers * per_block + logits)
    return Estimate(strategy, world, int(state), int(act))


def usable(host_bytes: int) -> int:
    return int(BUDGET * host_bytes)


def choose(shape: Shape, strategy: str, world: int, host_bytes: int | None) -> str:
    """The strategy to train with: `strategy` itself when it fits (or nothing is known of the hosts), the
    cheapest that fits for 'auto'; MemoryRefused, with the numbers and what would fit, otherwise."""
    if host_bytes is None:
        return "dp" if strategy == "auto" else strategy
    budget = usable(host_bytes)
    fits = [s for s in strategies(shape) if estimate(shape, s, world).total <= budget]
    if strategy != "auto" and strategy in fits:
        return strategy
    if strategy == "auto" and fits:
        return fits[0]
    asked = "dp" if strategy == "auto" else strategy
    need = estimate(shape, asked, world).total
    have = f"the smallest host has {gb(host_bytes)} ({gb(budget)} usable: {BUDGET:.0%})"
    if fits:
        other = estimate(shape, fits[0], world).total
        hint = (f"{fits[0]} at world {world} needs {gb(other)}: pass --strategy {fits[0]} "
                f"(or --strategy auto)")
    else:
        more = next((n for n in range(world + 1, 257) if estimate(shape, "zero3", n).total <= budget), None)
        least = estimate(shape, "zero3", world).total
        hint = (f"zero3 at world {world} needs {gb(least)}; " +
                (f"zero3 would fit on {more} such hosts" if more else "no number of such hosts fits it") +
                ", or make the model or --batch-size smaller")
    raise MemoryRefused(f"this run needs about {gb(need)} per rank under {asked} at world {world}; {have}; {hint} "
                        "(docs/trainer.md#memory-planning)")


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


def check_before_launch(args: list[str], world: int, memory: dict[str, int], overrides: dict[str, str],
                        first_os: str | None, project: str, data_dir: str | None = None) -> str | None:
    """`clusterctl run`'s early refusal, on the controller before any rank starts: the bundled trainer's
    `args` resolved as rank 0 will resolve them (its preset by rank 0's host: a Mac's GPU or a CPU), against
    the smallest host's memory as the pre-flight probed it (`memory`, host -> bytes) or as the inventory's
    env overrides it (`overrides`, host -> CLUSTERCTL_HOST_MEMORY). Raises MemoryRefused; returns the
    strategy that fits, or None when it cannot tell (resuming: the checkpoint holds the settings; a flag
    the trainer will refuse itself; an unknown vocabulary or host). The ranks check again as they start."""
    from ..trainer_contract import flag_value
    from .config import ConfigError, resolve

    if flag_value(args, "--resume") or flag_value(args, "--config"):
        return None
    try:
        config, _ = resolve(list(args), device="gpu" if first_os == "Darwin" else "cpu")
    except (ConfigError, SystemExit):
        return None
    if config.memory_check == "off":
        return None
    sizes = dict(memory)
    for host, text in overrides.items():
        try:
            sizes[host] = parse_size(text)
        except ValueError:
            return None
    if config.model:             # an mlx-lm model's own shape (prelaunch.py has checked the directory)
        from .lm import read_config, vocab_size

        model_config = read_config(config.model if os.path.isabs(config.model) else os.path.join(project, config.model))
        shape = Shape.of(config, vocab_size(model_config), model_config)
    else:
        vocab = _vocab(config, project, data_dir)
        shape = Shape.of(config, vocab) if vocab is not None else None
    if not sizes or shape is None:
        return None
    return choose(shape, config.strategy, world, min(sizes.values()))


def _vocab(config, project: str, data_dir: str | None) -> int | None:
    from ..data.shards import read_manifest
    from ..data.tokenizer import load_tokenizer
    from ..errors import ClusterctlError

    try:
        if data_dir or config.data:
            path = data_dir or os.path.join(project, config.data)
            return read_manifest(path).vocab_size
        spec = config.tokenizer
        if spec and spec != "byte" and not os.path.isabs(spec):
            spec = os.path.join(project, spec)
        return load_tokenizer(spec).vocab_size
    except (ClusterctlError, OSError, ValueError):
        return None
