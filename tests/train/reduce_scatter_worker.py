"""One rank of tests/train/test_fsdp.py's ring reduce-scatter check: collectives.reduce_scatter against
all_sum-then-slice for payloads below and above SENDRECV_MIN_BYTES (where it goes around the ring with
send/recv), float32 and bfloat16, each input with an all_gather still unevaluated in its graph. Prints one
JSON line per rank."""
import json

import mlx.core as mx

from clusterctl.train import collectives

group = collectives.init_world("ring")
n, r = group.size(), group.rank()
results = {}
for rows_per_rank, cols, dtype in ((1, 1000, mx.float32), (3, 200_000, mx.float32), (2, 300_001, mx.bfloat16)):
    x = (mx.random.normal((n * rows_per_rank, cols), key=mx.random.key(r)) * (r + 1)).astype(dtype)
    mx.eval(x)
    # a collective inside x's lazy graph, as zero3's unevaluated gather is (it hung send/recv once)
    x = x + 0 * mx.distributed.all_gather(x[:1, :8], group=group).sum()
    want = mx.distributed.all_sum(x, group=group)[r * rows_per_rank:(r + 1) * rows_per_rank]
    got = collectives.reduce_scatter(x, group)
    path = "sendrecv" if x.nbytes >= collectives.SENDRECV_MIN_BYTES else "all_sum"
    diff = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
    scale = mx.abs(want.astype(mx.float32)).max().item()
    results[f"{x.shape}-{dtype}"] = {"path": path, "shape_ok": got.shape == want.shape, "relative": diff / scale}
print(json.dumps({"rank": r, "world": n, "results": results}), flush=True)
