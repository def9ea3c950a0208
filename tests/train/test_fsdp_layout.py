"""Single-process tests of FSDP's pure parts: chunking, bucketing, packing (with a simulated
reduce-scatter over two ranks), the world-of-one step, and init_world's size check."""
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import pytest
from mlx.utils import tree_flatten

from clusterctl.train import collectives, fsdp
from clusterctl.train.collectives import WorldSizeMismatch, init_world, reduce_scatter, reduce_scatter_method
from clusterctl.train.fsdp import (
    Bucket,
    chunk_size,
    fsdp_apply_gradients,
    pack_rows,
    plan_buckets,
    split_row,
    unpack_rows,
)




@pytest.fixture(autouse=True)
def _default_world_forgotten():
    """These tests exercise the default world (mx.distributed.init() with no backend), which starts an MPI
    singleton in this process: its identity is taken out of the C environment after each (tests/conftest.py)."""
    from conftest import forget_mpi_singleton

    yield
    forget_mpi_singleton()

def _world_of_one_on_ring(monkeypatch):
    """fsdp's default group is mx.distributed.init()'s, which would start an MPI singleton in this process
    (tests/conftest.py): a world of one on ring instead."""
    one = mx.distributed.init(backend="ring")
    monkeypatch.setattr(mx.distributed, "init", lambda *a, **k: one)

def test_chunk_size_rounds_up():
    assert [chunk_size(n, 2) for n in (1, 2, 5, 6)] == [1, 1, 3, 3]
    assert chunk_size(15, 4) == 4


def test_buckets_close_once_they_reach_the_size_and_never_mix_dtypes():
    f32, bf16 = mx.float32, mx.bfloat16
    sizes, dtypes = [10, 7, 3, 5], [f32, bf16, f32, f32]
    # padded bytes at 2 shards: 40, 16 (bf16: 8 elements), 16, 24
    assert plan_buckets(sizes, dtypes, 2, 1 << 20) == [Bucket(f32, (0, 2, 3)), Bucket(bf16, (1,))]
    assert plan_buckets(sizes, dtypes, 2, 56) == [Bucket(f32, (0, 2)), Bucket(f32, (3,)), Bucket(bf16, (1,))]
    assert plan_buckets(sizes, dtypes, 2, 0) == [Bucket(f32, (0,)), Bucket(f32, (2,)), Bucket(f32, (3,)),
                                                 Bucket(bf16, (1,))]


def test_pack_reduce_scatter_and_unpack_round_trip_for_odd_shapes():
    shapes = [(5, 3), (7,), (), (4, 2)]
    ranks = [[mx.random.normal(s, key=mx.random.key(10 * r + i)) for i, s in enumerate(shapes)] for r in range(2)]
    packed = [pack_rows(arrays, 2) for arrays in ranks]
    assert packed[0].shape == (2, 8 + 4 + 1 + 4)
    summed = packed[0] + packed[1]                       # what every rank's all_sum would see
    rows = [summed[r] for r in range(2)]                 # rank r keeps row r after the reduce-scatter
    for r, row in enumerate(rows):
        for a, b, part in zip(ranks[0], ranks[1], split_row(row, [a.size for a in ranks[0]], 2)):
            chunk = chunk_size(a.size, 2)
            flat = (a + b).reshape(-1)
            expected = mx.concatenate([flat, mx.zeros((2 * chunk - flat.size,))])[r * chunk:(r + 1) * chunk]
            assert mx.array_equal(part, expected)
            assert mx.array_equal(fsdp.local_chunk(a, 2, r), pack_rows([a], 2)[r])
    for full, a, b in zip(unpack_rows(mx.stack(rows), shapes, 2), ranks[0], ranks[1]):
        assert full.shape == a.shape and mx.allclose(full, a + b)


def model_and_grads():
    mx.random.seed(3)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    x, y = mx.random.normal((6, 4)), mx.random.normal((6, 2))
    _, grads = nn.value_and_grad(model, lambda: nn.losses.mse_loss(model(x), y))()
    return model, grads


def test_world_of_one_is_a_plain_optimizer_step_and_returns_a_tuple_only_with_max_norm():
    model, grads = model_and_grads()
    reference = optim.AdamW(learning_rate=0.1)
    expected = reference.apply_gradients(grads, model.parameters())
    one = mx.distributed.init(backend="ring")     # a world of one without MPI (tests/conftest.py)
    updated = fsdp_apply_gradients(grads, model.parameters(), optim.AdamW(learning_rate=0.1), fsdp_group=one)
    assert isinstance(updated, dict)
    for (k, a), (_, b) in zip(tree_flatten(updated), tree_flatten(expected)):
        assert mx.array_equal(a, b), k

    clipped, norm = optim.clip_grad_norm(grads, 0.01)
    expected = optim.AdamW(learning_rate=0.1).apply_gradients(clipped, model.parameters())
    updated, grad_norm = fsdp_apply_gradients(grads, model.parameters(), optim.AdamW(learning_rate=0.1),
                                              fsdp_group=one, max_norm=0.01)
    assert grad_norm.item() == pytest.approx(norm.item(), rel=1e-6) and norm.item() > 0.01
    for (k, a), (_, b) in zip(tree_flatten(updated), tree_flatten(expected)):
        assert mx.allclose(a, b, atol=1e-7), k


def test_a_gradient_without_a_parameter_is_refused():
    model, grads = model_and_grads()
    grads["extra"] = mx.zeros((2,))
    with pytest.raises(ValueError, match="no parameter for gradient"):
        fsdp_apply_gradients(grads, model.parameters(), optim.SGD(learning_rate=0.1),
                             fsdp_group=mx.distributed.init(backend="ring"))


def test_reduce_scatter_on_a_group_of_one_is_the_identity():
    x = mx.arange(6).reshape(3, 2)
    assert reduce_scatter_method() == "identity"
    assert mx.array_equal(reduce_scatter(x), x)
    with pytest.raises(ValueError, match="not divisible"):
        reduce_scatter(mx.array(1.0))


def test_mlx_builtin_is_used_only_for_calls_it_can_do(monkeypatch):
    world = collectives.world_group()
    grads = [("w", mx.zeros((4, 2)))]
    assert fsdp._mlx_builtin(grads, world) is None                  # mlx 0.32.4 has none
    builtin = object()
    monkeypatch.setattr(fsdp.mlx.nn, "fsdp_apply_gradients", builtin, raising=False)
    assert fsdp._mlx_builtin(grads, world) is None                  # no native sum_scatter here
    monkeypatch.setattr(fsdp, "reduce_scatter_method", lambda group: "native")
    assert fsdp._mlx_builtin(grads, world) is builtin
    assert fsdp._mlx_builtin(grads + [("b", mx.zeros((3,), dtype=mx.bfloat16))], world) is None


def test_init_world_checks_the_launchers_world_size(monkeypatch):
    monkeypatch.delenv("CLUSTERCTL_WORLD_SIZE", raising=False)
    assert init_world().size() == 1
    monkeypatch.setenv("CLUSTERCTL_WORLD_SIZE", "1")
    assert init_world().size() == 1
    monkeypatch.setenv("CLUSTERCTL_WORLD_SIZE", "two")
    with pytest.raises(WorldSizeMismatch, match="not an integer"):
        init_world()
    monkeypatch.setenv("CLUSTERCTL_WORLD_SIZE", "2")
    with pytest.raises(WorldSizeMismatch, match="could not form the world of 2"):
        init_world()
