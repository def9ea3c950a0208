"""The per-rank reader: TokenFile maps without reading, rank_tokens reads only the rank's data, and
BatchLoader's batches are a pure function of (seed, rank, step)."""
import os
from array import array

import mlx.core as mx
import pytest

from clusterctl.data.corpus import is_val
from clusterctl.data.loader import BatchLoader, TokenArray, TokenFile, rank_tokens
from clusterctl.data.shards import prepare
from clusterctl.data.stories import DEFAULT_STORIES
from clusterctl.errors import ShardError


def write_tokens(path, values, code="H"):
    path.write_bytes(array(code, values).tobytes())
    return str(path)


def test_token_file_windows(tmp_path):
    for code, dtype in (("H", "uint16"), ("I", "uint32")):
        values = [7, 300, 65535 if dtype == "uint16" else 70000, 1, 2]
        f = TokenFile(write_tokens(tmp_path / dtype, values, code), dtype)
        assert len(f) == 5 and f.window(1, 3).tolist() == values[1:4]
        assert f.window(1, 3).dtype == (mx.uint16 if dtype == "uint16" else mx.uint32)
        with pytest.raises(ShardError, match=r"window \[3, 6\) is outside its 5 tokens"):
            f.window(3, 3)
        f.close()
    assert len(TokenFile(write_tokens(tmp_path / "empty", []), "uint16")) == 0


def test_token_file_refuses_a_truncated_or_wrong_length_file(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(b"\x01\x00\x02")
    with pytest.raises(ShardError, match="not a whole number of uint16 tokens"):
        TokenFile(str(path), "uint16")
    path.write_bytes(b"\x01\x00\x02\x00")
    with pytest.raises(ShardError, match="2 tokens, the manifest says 3"):
        TokenFile(str(path), "uint16", expected_tokens=3)
    with pytest.raises(ShardError, match="no such token file"):
        TokenFile(str(tmp_path / "missing"), "uint16")


def rss_bytes():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS from /proc")
def test_token_file_over_a_large_file_touches_only_its_windows(tmp_path):
    """512 MiB of tokens (a sparse file, so it costs no disk): mapping it and drawing 100 batches of
    8 x 256 must grow this process's resident memory by far less than the file (a read() of the whole
    file, or a copy of it, would add 512 MiB)."""
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        f.truncate(512 << 20)
    mx.eval(mx.zeros(4))                 # MLX's own start-up allocations before the baseline
    before = rss_bytes()
    tokens = TokenFile(str(path), "uint16")
    loader = BatchLoader(tokens, 8, 256, seed=0, rank=0)
    for step in range(100):
        x, y = loader.batch(step)
        mx.eval(x, y)
    assert len(tokens) == 256 << 20
    grew = rss_bytes() - before
    assert grew < 64 << 20, f"RSS grew by {grew >> 20} MiB"


def test_rank_tokens_from_prepared_shards(tmp_path):
    m = prepare("embedded:200", 2, str(tmp_path))
    train, val = rank_tokens(1, 2, data_dir=str(tmp_path))
    assert isinstance(train, TokenFile) and len(train) == m.tokens_per_shard and len(val) == m.val.tokens
    assert train.path.endswith("shard-00001-of-00002.bin")
    with pytest.raises(ShardError, match="prepared for world size 2, this run has 4"):
        rank_tokens(0, 4, data_dir=str(tmp_path))
    with pytest.raises(ShardError, match="rank 2 of world size 2"):
        rank_tokens(2, 2, data_dir=str(tmp_path))
    shard = tmp_path / m.shards[0].file
    shard.write_bytes(shard.read_bytes()[:-20])
    with pytest.raises(ShardError, match="truncated or corrupted"):
        rank_tokens(0, 2, data_dir=str(tmp_path))
    rank_tokens(1, 2, data_dir=str(tmp_path))       # rank 1 never looks at rank 0's shard


def test_rank_tokens_without_shards_generates_only_the_ranks_documents(monkeypatch):
    import clusterctl.data.corpus as corpus
    made = []
    real = corpus.story
    monkeypatch.setattr(corpus, "story", lambda seed, k: made.append(k) or real(seed, k))
    train, val = rank_tokens(2, 4, source="embedded:400")
    val_docs = {k for k in range(400) if is_val(k, 0.01)}
    assert set(made) == {k for k in range(400) if k % 4 == 2} | val_docs and len(made) == len(set(made))
    made.clear()
    whole, val1 = rank_tokens(0, 1, source="embedded:400")
    assert len(made) == 400 and val1.window(0, len(val1)).tolist() == val.window(0, len(val)).tolist()
    assert 0.2 < len(train) / len(whole) < 0.3        # about a quarter of the corpus
    assert isinstance(train, TokenArray)


def test_rank_tokens_seed_and_text_files(tmp_path):
    a, _ = rank_tokens(0, 2, seed=1)
    b, _ = rank_tokens(0, 2, seed=2)
    assert a.window(0, 100).tolist() != b.window(0, 100).tolist()
    assert 0.4 < len(a) / (940 * DEFAULT_STORIES) < 0.6    # half of the default corpus (~940 bytes a story)
    (tmp_path / "c.txt").write_text("one\n\ntwo\n\nthree\n")
    train, val = rank_tokens(1, 2, source=str(tmp_path / "c.txt"))
    assert train.window(0, len(train)).tolist() == list(b"two") + [256] and len(val) == 0


def test_batches_are_a_pure_function_of_seed_rank_and_step():
    tokens = TokenArray(list(range(5000)))
    loader = BatchLoader(tokens, 4, 16, seed=7, rank=0)
    x, y = loader.batch(3)
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == mx.int32
    assert (x[:, 1:] == y[:, :-1]).all().item()               # y is x shifted by one token
    assert all(row[-1] - row[0] == 15 for row in x.tolist())  # each row is one contiguous window
    again = BatchLoader(tokens, 4, 16, seed=7, rank=0)
    assert again.batch(3)[0].tolist() == x.tolist()           # fresh loader, same step: same batch (resume)
    assert loader.batch(4)[0].tolist() != x.tolist()
    assert BatchLoader(tokens, 4, 16, seed=7, rank=1).batch(3)[0].tolist() != x.tolist()
    assert BatchLoader(tokens, 4, 16, seed=8, rank=0).batch(3)[0].tolist() != x.tolist()


def test_ranks_read_different_data_from_their_shards(tmp_path):
    m = prepare("embedded:200", 2, str(tmp_path))
    rows = [BatchLoader(rank_tokens(r, 2, data_dir=str(tmp_path))[0], 8, 64, seed=0, rank=r).batch(0)[0].tolist()
            for r in range(2)]
    assert rows[0] != rows[1]
    for r in range(2):      # and what rank r reads is its own shard file's windows, not the other's
        own = TokenFile(str(tmp_path / m.shards[r].file), m.dtype)
        assert BatchLoader(own, 8, 64, seed=0, rank=r).batch(0)[0].tolist() == rows[r]
        other = TokenFile(str(tmp_path / m.shards[1 - r].file), m.dtype)
        assert BatchLoader(other, 8, 64, seed=0, rank=r).batch(0)[0].tolist() != rows[r]


def test_a_loader_needs_one_full_window():
    with pytest.raises(ShardError, match="10 tokens cannot fill one window of block_size \\+ 1 = 17"):
        BatchLoader(TokenArray(list(range(10))), 2, 16, seed=0, rank=0)
    with pytest.raises(ShardError, match="must be >= 1"):
        BatchLoader(TokenArray(list(range(10))), 0, 4, seed=0, rank=0)
