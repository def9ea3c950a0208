"""ZeRO-3: parameters, gradients and optimizer state all sharded over the ranks (`--strategy zero3`).

Each rank permanently holds 1/N of every parameter. The parameters a unit (below) uses are stored as one flat
vector (a FlatGroup, as PyTorch FSDP's flat parameter): their concatenation, each flattened row-major, zero-
padded to a multiple of N, of which rank r keeps elements [r*chunk, (r+1)*chunk). One all_gather returns the
whole vector contiguously and every parameter is a view of it (gathering per parameter would copy each out of a
strided block); AdamW, elementwise, makes the same updates on the slices as data parallel on the whole. The
model object keeps its structure with empty placeholder arrays; the full weights of one unit at a time exist
only while it computes:

    units           the embedding lookup, each Transformer block, the head (final norm and the tied
                    output matrix, with the loss)
    forward         per unit: all-gather its weights (the next unit's gather is started before this one
                    computes, --zero3-gather prefetch), compute, evaluate, drop the weights; keep only each
                    block's input activation (B x L x dim)
    backward        per unit in reverse: gather its weights again, recompute the unit and take its
                    vector-Jacobian product (one extra forward per unit, the price of not keeping every
                    unit's weights and activations; the unit's output is left out of it, and with it whatever
                    only the output needs), reduce-scatter its weight gradients into this rank's slice, drop
                    the full gradients
    update          clip by the global norm (squares summed over the slices, then all_sum), AdamW on the
                    slices only

An adapter run (--adapter) shards the frozen base and keeps the adapters whole on every rank. Nothing in the base
is ever updated, so its groups need not be one dtype each: a unit's frozen tensors (a quantized layer's uint32
packed weights, its float scales and biases, the norms) are one vector of bytes, each tensor a view of it in its
own dtype, and a group spans consecutive units while it holds at most memory.zero3_span() bytes: one all_gather
moves a span, where a unit of a 4-bit base is too small for its bytes, not its latency, to be the cost. The adapters'
gradients are summed over the ranks in one all_sum.

The step's collectives run on a stream of their own (`self.comm`), in the order they are issued, which is every
rank's: on the CPU each stream is a thread, so a prefetched gather runs while the unit before it computes
(docs/facts/mlx-distributed.md#a-cpu-stream-is-a-thread). Re-gathering in the backward pass rather than keeping
each unit's gathered weights from the forward pass is the memory choice: keeping them (--zero3-gather keep)
holds the full model on every rank at the end of the forward pass, which is what zero3 is for avoiding; `plain`
gathers without prefetching (docs/trainer.md#zero3 has the measured costs of the three). The last block's and the
head's weights gathered in the forward pass are reused at once by the backward pass, not gathered twice.

Reduce-scatter: `collectives.reduce_scatter` (native sum_scatter on nccl/jaccl, MPI's Reduce_scatter_block
through mpi4py under mpirun, all_sum then slice or send/recv around the ring on ring). Dropout: the random key
before each unit's forward is kept and restored for its recomputation, so the recomputed masks are the
forward pass's, and the key after the forward pass is restored at the end, so the masks follow the same
sequence as the whole model's (dp's, bit for bit on one rank: tests/train/test_fit.py). Each unit's forward
and vector-Jacobian product are mx.compile'd once (about 1.2x faster here than uncompiled).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from .collectives import reduce_scatter
from .fsdp import clip_by_global_norm, local_chunk, pack_rows
from .memory import zero3_span
from .model import at_picks, masked_cross_entropy
from .packing import block_mask
from .randomstate import restore_random_state


@dataclass(frozen=True)
class Unit:
    """A piece of the model computed with its full weights gathered: `keys` are its parameters (flattened
    names), `call(params, *inputs)` computes it with `params` (key -> full array)."""
    name: str
    keys: tuple[str, ...]
    call: Callable


def transformer_units(model) -> list[Unit]:
    """The bundled Transformer (model.py) as units: embedding, blocks, head (the tied output uses the
    embedding matrix again, so its gradient comes from two units and is summed)."""
    def embed(params, tokens):
        model.embedding.weight = params["embedding.weight"]
        return model.embedding(tokens)

    def head(params, x, targets):
        model.norm.weight = params["norm.weight"]
        model.embedding.weight = params["embedding.weight"]
        return masked_cross_entropy(model.embedding.as_linear(model.norm(x)), targets)

    return _units(model, Unit("embedding", ("embedding.weight",), embed), "layers.", model.layers,
                  lambda layer, x: layer(x), Unit("head", ("norm.weight", "embedding.weight"), head))


def lm_units(model) -> list[Unit]:
    """An mlx-lm model (lm.ZERO3_TYPES: llama, mistral, qwen2, qwen3) as units: `model.embed_tokens`, each of
    `model.layers` (called as the model calls it: hidden state and the causal mask), and the head (`model.norm`,
    then `lm_head` or, tied, the embedding matrix again, with the loss). Other architectures compute more in their
    forward pass (scaled embeddings, sliding windows, shared layers) and are refused by the trainer."""
    inner = model.model
    tied = not hasattr(model, "lm_head")
    if getattr(inner, "swa_idx", None) is not None:
        raise ValueError("zero3: sliding-window attention layers are not cut into units")
    every = [k for k, _ in tree_flatten(model.parameters())]

    def under(prefix: str) -> tuple[str, ...]:       # a module's parameters (a quantized one's scales and biases too)
        return tuple(k for k in every if k.startswith(prefix))

    def load(module, params, prefix):
        module.update(tree_unflatten([(k[len(prefix):], v) for k, v in params.items() if k.startswith(prefix)]))

    def embed(params, tokens):
        load(inner.embed_tokens, params, "model.embed_tokens.")
        return inner.embed_tokens(tokens)

    def head(params, x, targets, picks=None):     # picks: the trained positions alone (model.loss_fn)
        load(inner.norm, params, "model.norm.")
        if picks is not None:
            x, targets = at_picks(x, targets, picks)
        if tied:
            load(inner.embed_tokens, params, "model.embed_tokens.")
            logits = inner.embed_tokens.as_linear(inner.norm(x))
        else:
            load(model.lm_head, params, "lm_head.")
            logits = model.lm_head(inner.norm(x))
        return masked_cross_entropy(logits, targets)

    def call_layer(layer, x, segments=None):      # segments: packed records, each attending to itself alone
        if segments is not None:
            return layer(x, block_mask(segments))
        return layer(x, "causal" if x.shape[1] > 1 else None)

    embedding = under("model.embed_tokens.")
    return _units(model, Unit("embedding", embedding, embed), "model.layers.", inner.layers, call_layer,
                  Unit("head", under("model.norm.") + (embedding if tied else under("lm_head.")), head))


def _units(model, embed: Unit, prefix: str, layers, call_layer: Callable, head: Unit) -> list[Unit]:
    """embed, a unit per block (layer i's parameters are those named `prefix` i `.`, loaded into the layer before
    `call_layer(layer, x)`), head; every trainable parameter must be in some unit."""
    def block(layer, mine: str):
        def call(params, x, *segments):
            layer.update(tree_unflatten([(k[len(mine):], v) for k, v in params.items()]))
            return call_layer(layer, x, *segments)
        return call

    keys = [k for k, _ in tree_flatten(model.parameters())]     # trained and frozen (an adapter run's base)
    units = [embed]
    for i, layer in enumerate(layers):
        mine = f"{prefix}{i}."
        units.append(Unit(f"layers.{i}", tuple(k for k in keys if k.startswith(mine)), block(layer, mine)))
    units.append(head)
    covered = {k for u in units for k in u.keys}
    if covered != set(keys):
        raise ValueError(f"zero3: parameters in no unit: {sorted(set(keys) - covered)[:5]}")
    return units


@dataclass(frozen=True)
class FlatGroup:
    """Parameters stored as one flat vector, sharded as a whole: rank r holds elements [r*chunk, (r+1)*chunk)
    of the concatenation of `keys` (each flattened row-major, at `offsets`), zero-padded to world x chunk.
    One all_gather returns the whole vector contiguously, and each parameter is a view of it: no copy.

    A frozen unit's group (an adapter run's base: never updated, so never stepped by AdamW as one dtype) is a
    vector of bytes: each parameter's bytes, whatever its dtype (`kinds`: a quantized layer's uint32 packed
    weights beside its float scales and biases), at an offset aligned to ALIGN, so one collective moves them all."""
    name: str
    dtype: mx.Dtype
    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    kinds: tuple[mx.Dtype, ...] | None = None     # a byte group's parameters' own dtypes

    def length(self, i: int) -> int:
        """Elements of the flat vector parameter i takes."""
        n = math.prod(self.shapes[i])
        return n if self.kinds is None else n * self.kinds[i].size

    @property
    def size(self) -> int:
        return self.offsets[-1] + self.length(len(self.keys) - 1)

    def flatten(self, params: dict) -> mx.array:
        """The group's vector of `params` (key -> full array), unpadded."""
        if self.kinds is None:
            return mx.concatenate([params[k].reshape(-1) for k in self.keys])
        parts, at = [], 0
        for k, offset in zip(self.keys, self.offsets):
            if offset > at:
                parts.append(mx.zeros((offset - at,), dtype=mx.uint8))
            parts.append(params[k].reshape(-1).view(mx.uint8))
            at = offset + parts[-1].size
        return mx.concatenate(parts)

    def views(self, flat: mx.array) -> dict[str, mx.array]:
        """Each parameter as a view of the gathered vector (viewed as its own dtype in a byte group)."""
        out = {}
        for i, (k, shape, at) in enumerate(zip(self.keys, self.shapes, self.offsets)):
            piece = flat[at:at + self.length(i)]
            out[k] = (piece if self.kinds is None else piece.view(self.kinds[i])).reshape(shape)
        return out


ALIGN = 16       # bytes: every parameter of a byte group starts at a multiple (any dtype's view is aligned)


def flat_groups(units: list[Unit], shapes: dict, dtypes: dict, frozen: bool = False,
                span_bytes: int = 0) -> list[FlatGroup]:
    """A group per unit of the parameters that unit is the first to use (the head's tied output matrix is the
    embedding's, so it stays in the embedding's group): one per dtype, or, `frozen` (nothing in them is ever
    updated), one vector of bytes whatever their dtypes, spanning consecutive units while it holds at most
    `span_bytes` (a unit larger than that is a span of its own)."""
    groups, placed = [], set()
    span: list[tuple[str, str]] = []          # (unit name, key) of the frozen group being filled
    held = 0                                  # its bytes
    for unit in units:
        mine = [k for k in unit.keys if k not in placed]
        placed.update(mine)
        if frozen:
            size = sum(math.prod(shapes[k]) * dtypes[k].size for k in mine)
            if span and held + size > span_bytes:
                groups.append(_byte_group(span, shapes, dtypes))
                span, held = [], 0
            span += [(unit.name, k) for k in mine]
            held += size
            continue
        kinds = list(dict.fromkeys(dtypes[k] for k in mine))
        for dtype in kinds:
            keys = tuple(k for k in mine if dtypes[k] == dtype)
            offsets, at = [], 0
            for k in keys:
                offsets.append(at)
                at += math.prod(shapes[k])
            name = unit.name if len(kinds) == 1 else f"{unit.name}:{str(dtype).removeprefix('mlx.core.')}"
            groups.append(FlatGroup(name, dtype, keys, tuple(shapes[k] for k in keys), tuple(offsets)))
    if span:
        groups.append(_byte_group(span, shapes, dtypes))
    return groups


def _byte_group(span: list[tuple[str, str]], shapes: dict, dtypes: dict) -> FlatGroup:
    """The frozen parameters `span` ((unit name, key), in order) as one vector of bytes, each at an offset
    aligned to ALIGN; named after its first and last unit."""
    keys = tuple(k for _, k in span)
    offsets, at = [], 0
    for k in keys:
        at = -(-at // ALIGN) * ALIGN
        offsets.append(at)
        at += math.prod(shapes[k]) * dtypes[k].size
    first, last = span[0][0], span[-1][0]
    return FlatGroup(first if first == last else f"{first}..{last}", mx.uint8, keys, tuple(shapes[k] for k in keys),
                     tuple(offsets), tuple(dtypes[k] for k in keys))


class ShardedModel:
    """A model whose parameters live as this rank's slices of flat groups (`self.shards`, group name -> 1-D
    array of `chunk` elements; `self.groups` says what is where). Build it from a model whose parameters are
    not evaluated yet (MLX is lazy): one group at a time is evaluated, sliced and dropped, so the full model
    never exists on a rank."""

    def __init__(self, model, group, gather: str = "prefetch", dropout: bool | None = None, span: int | None = None):
        if gather not in GATHER_MODES:
            raise ValueError(f"zero3 gather mode {gather!r}: one of {', '.join(GATHER_MODES)}")
        self.model, self.group = model, group
        self.prefetch, self.keep = gather != "plain", gather == "keep"
        self.world, self.rank = group.size(), group.rank()
        # whether the forward pass draws random numbers (its recomputation must draw the same)
        self.dropout = getattr(getattr(model, "args", None), "dropout", 0.0) > 0 if dropout is None else dropout
        params = dict(tree_flatten(model.parameters()))
        trained = {k for k, _ in tree_flatten(model.trainable_parameters())}
        # counted as dp counts it (mlx-lm's count for its models: a 4-bit weight as the values it packs), while whole
        if hasattr(model, "embedding"):
            from .model import count_parameters
            self.parameter_count = count_parameters(model)
        else:
            from .lm import total_parameters
            self.parameter_count = total_parameters(model)
        # an adapter run (--adapter): the frozen base is what is sharded, gathered unit by unit and never updated;
        # the adapters stay whole on every rank (`replicated`), their gradients averaged over the ranks as dp's
        self.frozen = len(trained) < len(params)
        self.replicated: dict[str, mx.array] = {k: params.pop(k) for k in trained} if self.frozen else {}
        self.shapes = {k: tuple(v.shape) for k, v in params.items()}
        self.dtypes = {k: v.dtype for k, v in params.items()}
        self.units = transformer_units(model) if hasattr(model, "embedding") else lm_units(model)
        if span is None:        # memory.zero3_span of the frozen base (its packed bytes when quantized)
            span = zero3_span(sum(math.prod(s) * self.dtypes[k].size for k, s in self.shapes.items()))
        self.groups = flat_groups([Unit(u.name, tuple(k for k in u.keys if k in params), u.call) for u in self.units],
                                  self.shapes, self.dtypes, frozen=self.frozen, span_bytes=span)
        self.group_of = {k: g for g in self.groups for k in g.keys}
        # the step's collectives (gathers, sums, reduce-scatters) go on a stream of their own, in the order they
        # are issued, which is every rank's: a gather queued on the stream the units compute on would wait for the
        # computation queued before it (docs/facts/mlx-distributed.md#a-cpu-stream-is-a-thread). The backends
        # clusterctl launches (ring, mpi, jaccl) all communicate on a CPU stream.
        self.comm = mx.new_stream(mx.cpu) if self.world > 1 else None
        self.shards: dict[str, mx.array] = {}
        for g in self.groups:
            flat = g.flatten({k: params.pop(k) for k in g.keys})
            self._release_keys(g.keys)        # the model must not keep the group's full arrays once evaluated
            # a copy: a slice would be a view that keeps the whole group's buffer alive
            self.shards[g.name] = mx.contiguous(local_chunk(flat, self.world, self.rank))
            del flat
            mx.eval(self.shards[g.name])
        self._fns: dict = {}

    # --- what fit and the checkpoints see -------------------------------------------------------------
    @property
    def state(self):
        return [self.shards, self.replicated]

    def parameters(self):
        return self.shard_tree()

    def shard_tree(self):
        return tree_unflatten(list(self.shards.items()))

    def num_parameters(self) -> int:
        """The whole model's parameter count, as the unsharded model prints it (taken before its weights were let go)."""
        return self.parameter_count

    def trainable_parameters(self):
        """An adapter run's adapters (whole on every rank); a full fine-tune's are all in `shards`."""
        return tree_unflatten(list(self.replicated.items()))

    @property
    def layers(self):
        return self.model.layers

    @property
    def args(self):
        return getattr(self.model, "args", None)

    def adopt_trained(self) -> None:
        """The adapters the model holds now (loaded from a checkpoint) as the replicated ones."""
        if self.frozen:
            self.replicated = {k: v for k, v in tree_flatten(self.model.trainable_parameters())}

    def train(self):
        self.model.train()

    def eval(self):
        self.model.eval()

    # --- gathering and scattering -----------------------------------------------------------------------
    def _groups(self, keys) -> list[FlatGroup]:
        return list(dict.fromkeys(self.group_of[k] for k in keys if k in self.group_of))

    def _fetch(self, window: dict, unit: Unit) -> None:
        """Gather into `window` (group name -> its parameters, each a view of the gathered vector) the groups of
        `unit` it lacks: one all_gather a group, on the communication stream. Under prefetch only the gathered
        vectors are evaluated at once: a view evaluated on the computing stream would hold that stream until its
        gather is done."""
        missing = [g for g in self._groups(unit.keys) if g.name not in window]
        if not missing:
            return
        if self.world == 1:
            flats = {g.name: self.shards[g.name] for g in missing}
        else:
            flats = {g.name: mx.reshape(mx.distributed.all_gather(self.shards[g.name][None], group=self.group,
                                                                  stream=self.comm), (-1,), stream=self.comm)
                     for g in missing}
            if self.prefetch:
                mx.async_eval(list(flats.values()))
        for g in missing:
            window[g.name] = g.views(flats[g.name])

    def _params(self, window: dict, unit: Unit) -> dict[str, mx.array]:
        """The unit's full parameters: its groups' from `window`, an adapter run's adapters as they are."""
        out = {k: self.replicated[k] for k in unit.keys if k in self.replicated}
        for g in self._groups(unit.keys):
            out.update((k, v) for k, v in window[g.name].items() if k in unit.keys)
        return out

    def _keep_for(self, window: dict, units) -> None:
        """Drop from `window` the groups none of `units` uses."""
        needed = {g.name for u in units for g in self._groups(u.keys)}
        for name in [name for name in window if name not in needed]:
            del window[name]

    def _scatter_into(self, grads: dict[str, mx.array], acc: dict[str, mx.array]) -> None:
        """Reduce-scatter full gradients (this rank's, of one unit's groups) and add this rank's slices into acc."""
        for g in self._groups(grads):
            flat = mx.concatenate([grads[k].reshape(-1).astype(g.dtype) for k in g.keys])
            if self.world == 1:
                row = flat
            else:        # the padded (world, chunk) layout the shards have (fsdp.pack_rows of one array)
                # computed first, beside the prefetched gather, which must then be done: the ring's large
                # reduce-scatter and MPI's (mpi4py) run eagerly on this thread, and two collectives at once would
                # meet the other ranks' in another order
                mx.eval(flat)
                mx.synchronize(self.comm)
                row = reduce_scatter(pack_rows([flat], self.world), self.group, stream=self.comm).reshape(-1)
            acc[g.name] = row if acc.get(g.name) is None else acc[g.name] + row

    def _sum(self, arrays: dict[str, mx.array]) -> dict[str, mx.array]:
        """`arrays` summed over the ranks: one all_sum per dtype, of all of them concatenated (an all_sum each was
        224 round trips a step for LoRA on a 16-block model: 4.6 s of a 14.7 s step at world 4, measured)."""
        if self.world == 1:
            return arrays
        out = {}
        for dtype in dict.fromkeys(v.dtype for v in arrays.values()):
            keys = [k for k, v in arrays.items() if v.dtype == dtype]
            total = mx.distributed.all_sum(mx.concatenate([arrays[k].reshape(-1) for k in keys]), group=self.group,
                                           stream=self.comm)
            at = 0
            for k in keys:
                out[k] = total[at:at + arrays[k].size].reshape(arrays[k].shape)
                at += arrays[k].size
        return out

    # --- the computation ----------------------------------------------------------------------------------
    def _release(self, unit: Unit) -> None:
        """Put placeholders back where `unit.call` set full weights into the model, so nothing holds them, and an
        adapter run's adapters back as they are (a compiled unit traced anew, for a new shape of rows, leaves its
        traced arrays in the model)."""
        self._release_keys(unit.keys)
        mine = [(k, self.replicated[k]) for k in unit.keys if k in self.replicated]
        if mine:
            self.model.update(tree_unflatten(mine))

    def _release_keys(self, keys) -> None:
        self.model.update(tree_unflatten([(k, mx.zeros((0,), dtype=self.dtypes[k])) for k in keys
                                          if k not in self.replicated]))

    def _compiled(self, unit: Unit, kind: str, inputs: int = 0, output: bool = False):
        """The unit's forward ("run": weights, inputs -> output) or its vector-Jacobian product ("vjp": weights,
        `inputs` differentiated inputs, constants, cotangent -> [output,] weight gradients, input cotangents),
        each compiled once (mx.compile fuses the elementwise work; the random state is an input for dropout).
        The vjp returns the unit's output only when asked (`output`: the head's loss): a block's recomputed
        output is not needed, and left out of the compiled graph it is never computed, nor whatever only it
        needs (a block's down and output projections: the gradients need their inputs, not their results)."""
        key = (unit.name, kind, inputs, output)
        if key not in self._fns:
            n = len(unit.keys)
            keys = list(unit.keys)
            diff, fixed = self._split(unit)
            nd, nf = len(diff), len(fixed)

            def run(*args):
                return unit.call(dict(zip(keys, args[:n])), *args[n:])

            def vjp(*args):
                # the trained parameters and the inputs are differentiated; a frozen base's are constants
                primals, rest, cotangent = args[:nd + inputs], args[nd + inputs:-1], args[-1]
                base, const = dict(zip(fixed, rest[:nf])), rest[nf:]
                out, grads = mx.vjp(lambda *a: unit.call({**base, **dict(zip(diff, a[:nd]))}, *a[nd:], *const),
                                    list(primals), [cotangent])
                return (out[0], *grads) if output else tuple(grads)

            state = [mx.random.state]
            fn = run if kind == "run" else vjp
            self._fns[key] = mx.compile(fn, inputs=state, outputs=state)
        return self._fns[key]

    def _run(self, unit: Unit, params: dict, *inputs) -> mx.array:
        out = self._compiled(unit, "run")(*(params[k] for k in unit.keys), *inputs)
        mx.eval(out)
        self._release(unit)
        return out

    def _lowest_trained(self) -> int:
        """The first unit with a trained parameter: the backward pass stops there (below an adapter run's lowest
        adapted block nothing is trained, and the tokens need no gradient)."""
        return next(i for i, u in enumerate(self.units) if self._split(u)[0])

    def _split(self, unit: Unit) -> tuple[list[str], list[str]]:
        """(the unit's parameters that are trained, those that are a frozen base's)."""
        if not self.frozen:
            return list(unit.keys), []
        return [k for k in unit.keys if k in self.replicated], [k for k in unit.keys if k not in self.replicated]

    def _vjp(self, unit: Unit, params: dict, inputs: list, const: list, cotangent: mx.array, acc: dict,
             output: bool = False):
        """(output if asked else None, cotangents of `inputs`) of `unit` at inputs + const (const: not
        differentiated), its weight gradients reduce-scattered into acc (an adapter run's: its adapters' gradients
        added into acc whole), everything evaluated and the full weights and gradients dropped."""
        diff, fixed = self._split(unit)
        fn = self._compiled(unit, "vjp", len(inputs), output)
        got = fn(*(params[k] for k in diff), *inputs, *(params[k] for k in fixed), *const, cotangent)
        out, grads = (got[0], got[1:]) if output else (None, got)
        mine = dict(zip(diff, grads[:len(diff)]))
        if self.frozen:
            for k, g in mine.items():
                acc[k] = g if acc.get(k) is None else acc[k] + g
            held = [acc[k] for k in mine]
        else:
            self._scatter_into(mine, acc)
            held = [acc[g.name] for g in self._groups(diff)]
        back = grads[len(diff):]
        mx.eval(*([out] if output else []), back, *held)
        self._release(unit)
        return out, back

    def loss(self, tokens: mx.array, targets: mx.array, *segments: mx.array) -> mx.array:
        """Mean next-token loss of one batch, forward only (held-out evaluation); `segments`: packed records'
        (packing.py), which every block is given."""
        units = self.units
        window: dict = {}
        self._fetch(window, units[0])
        h = tokens
        for i, unit in enumerate(units):
            last = i + 1 == len(units)
            if self.prefetch and not last:
                self._fetch(window, units[i + 1])
            h = self._run(unit, self._params(window, unit), *((h, targets) if last else (h, *segments) if i else (h,)))
            if not last:
                self._fetch(window, units[i + 1])
                self._keep_for(window, units[i + 1:i + 2])
        return h

    def micro_batch(self, tokens, targets, scale: float, acc: dict[str, mx.array], *packed) -> mx.array:
        """Forward and backward of one micro-batch; adds `scale` x the sum over ranks of the weight
        gradients into this rank's slices in `acc`. Returns the micro-batch's mean loss (this rank's).
        `packed`: packed records' segments (packing.py), a constant input of every block, then perhaps the
        trained positions (records.trained_positions), the head's.

        `window` holds the groups gathered now: the unit computing's and, under prefetch, the next one's (every
        unit's from the forward pass under keep); the last block's stay from the forward pass for its backward."""
        units, dropout = self.units, self.dropout
        segments, picks = packed[:1], packed[1:]
        n = len(units)
        inputs: list = [None] * n            # inputs[i]: unit i's input activation
        keys_before: list = [None] * n
        window: dict = {}
        self._fetch(window, units[0])
        h = tokens
        for i in range(n - 1):                # embedding and blocks, forward
            if self.prefetch:
                self._fetch(window, units[i + 1])
            inputs[i] = h
            if dropout:
                keys_before[i] = _random_key()
            h = self._run(units[i], self._params(window, units[i]), h, *(segments if i else ()))
            self._fetch(window, units[i + 1])
            if not self.keep:
                self._keep_for(window, units[i:] if i == n - 2 else units[i + 1:i + 2])
        after = _random_key() if dropout else None        # where the next micro-batch's masks continue from
        loss, (dh,) = self._vjp(units[-1], self._params(window, units[-1]), [h], [targets, *picks],
                                mx.array(scale, dtype=mx.float32), acc, output=True)
        lowest = self._lowest_trained()
        for i in range(n - 2, lowest - 1, -1):        # blocks and embedding, backward (to the lowest trained unit)
            self._fetch(window, units[i])
            self._keep_for(window, units[lowest if self.keep else max(i - 1, lowest):i + 1])
            if self.prefetch and i > lowest:
                self._fetch(window, units[i - 1])
            if dropout:
                restore_random_state(keys_before[i])
            if i == 0:                        # the tokens are not differentiable
                self._vjp(units[0], self._params(window, units[0]), [], [tokens], dh, acc)
            else:
                _, (dh,) = self._vjp(units[i], self._params(window, units[i]), [inputs[i]], list(segments), dh,
                                     acc)
            inputs[i] = None
        if dropout:
            restore_random_state(after)
        return loss

    def step(self, optimizer, max_norm: float, x: mx.array, y: mx.array, *packed: mx.array):
        """One optimizer step over the micro-batches x[i], y[i] (and, for packed records, segments and perhaps
        the trained positions: packed[j][i]): (mean loss over the ranks, gradient norm)."""
        accum = x.shape[0]
        scale = 1.0 / (accum * self.world)
        acc: dict[str, mx.array] = {}
        loss = mx.array(0.0)
        for i in range(accum):
            loss = loss + self.micro_batch(x[i], y[i], scale, acc, *(s[i] for s in packed))
            mx.eval(loss)
        if self.frozen:
            return self._adapter_step(optimizer, acc, loss / accum, max_norm)
        grad_tree = tree_unflatten([(k, acc.pop(k)) for k in self.shards])
        grad_tree, norm = clip_by_global_norm(grad_tree, max_norm, self.group)
        mx.eval(norm)
        updated = tree_flatten(optimizer.apply_gradients(grad_tree, self.shard_tree()))
        del grad_tree
        # evaluated one group at a time: AdamW's temporaries for the whole model at once were 4 x the
        # parameters' bytes on top of the state (measured), one group's are 4 x that group's
        state = tree_flatten(optimizer.state)
        for name, new in updated:
            mx.eval(new, *(v for k, v in state if k.startswith(name + ".")))
            self.shards[name] = new
        loss = loss / accum
        if self.world > 1:
            loss = mx.distributed.all_sum(loss, group=self.group, stream=self.comm) / self.world
        return loss, norm


    def _adapter_step(self, optimizer, acc: dict[str, mx.array], loss: mx.array, max_norm: float):
        """An adapter run's update: the adapters' gradients (each rank's share of the mean) summed over the ranks,
        clipped by their global norm, AdamW on the adapters every rank holds whole, as dp updates them."""
        import mlx.optimizers as optim

        from .step import global_norm

        grads = tree_unflatten(list(self._sum(acc).items()))
        if math.isfinite(max_norm):
            grads, norm = optim.clip_grad_norm(grads, max_norm)
        else:
            norm = global_norm(grads)
        updated = optimizer.apply_gradients(grads, tree_unflatten(list(self.replicated.items())))
        self.replicated = dict(tree_flatten(updated))
        self.model.update(updated)
        mx.eval(self.replicated, optimizer.state, norm)
        if self.world > 1:
            loss = mx.distributed.all_sum(loss, group=self.group, stream=self.comm) / self.world
        return loss, norm


def _random_key() -> list[int]:
    key = mx.random.state[0]
    mx.eval(key)
    return key.tolist()


GATHER_MODES = ("prefetch", "plain", "keep")


def make_zero3_step(sharded: ShardedModel, optimizer, config):
    max_norm = config.max_norm or math.inf

    def step(*batch):
        return sharded.step(optimizer, max_norm, *batch)
    return step
