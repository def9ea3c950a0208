"""What every rank of `clusterctl serve` runs on its host: mlx-lm's server on that host's copy of the model.

    python -m clusterctl.serve.rank MODELS_JSON [SERVER ARGUMENTS...]

MODELS_JSON lists, rank by rank, the model's directory in that rank's host's model store (`serve` pushed it
there; the store's path differs per host). Standard library and mlx-lm only: it runs on the hosts, from the
copy of clusterctl `serve` ships to each (<workdir>/.clusterctl/lib). Before mlx-lm's own main() it:
  - gives the server `--model` with this rank's directory, fully resolved: mlx-lm lists the model under that
    name in /v1/models, and a request naming it is answered by the loaded model (not a second load);
  - makes `GET /v1/models` answer on a host with no Hugging Face cache directory. mlx-lm scans that cache for
    the models it lists; where the directory does not exist the scan raises after the 200 status line was sent,
    so the client gets an empty body (mlx-lm issue 1636, open; docs/facts/mlx-lm.md#v1-models-without-a-hub-cache).
    The scan then finds no cached models instead, and the served model is listed as always;
  - leaves clusterctl's own health and readiness requests (User-Agent PROBE_AGENT) out of the server's request
    log: `serve` asks /health every few seconds, which would otherwise be most of what the ranks print.
"""
import json
import os
import sys
import types

PROBE_AGENT = "clusterctl-probe"      # serve/endpoint.py sends it


def rank() -> int:
    """This rank's number, from whichever launcher started it (mpirun or MLX's ring / jaccl)."""
    for name in ("OMPI_COMM_WORLD_RANK", "MLX_RANK", "PMI_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def model_for(models_json: str, my_rank: int) -> str:
    """This rank's model directory (the last entry for a rank past the list), ~ expanded, resolved."""
    models = json.loads(models_json)
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise SystemExit(f"clusterctl.serve.rank: MODELS_JSON must be a non-empty JSON list of paths, not {models_json!r}")
    path = os.path.realpath(os.path.expanduser(models[min(my_rank, len(models) - 1)]))
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise SystemExit(f"clusterctl.serve.rank: {path}: no model there (no config.json)")
    return path


def tolerate_missing_hub_cache(server) -> None:
    """mlx-lm's /v1/models handler scans the Hugging Face cache; a missing cache becomes an empty scan."""
    try:
        from huggingface_hub.errors import CacheNotFound
    except ImportError:      # older huggingface_hub
        from huggingface_hub.utils import CacheNotFound
    scan = server.scan_cache_dir

    def scan_or_nothing(*args, **kwargs):
        try:
            return scan(*args, **kwargs)
        except CacheNotFound:
            return types.SimpleNamespace(repos=frozenset(), size_on_disk=0, warnings=[])

    server.scan_cache_dir = scan_or_nothing


def quiet_probes(server) -> None:
    """No request-log line for clusterctl's own requests (BaseHTTPRequestHandler.log_message is the request log)."""
    handler = server.APIHandler
    log = handler.log_message

    def log_message(self, fmt, *args):
        headers = getattr(self, "headers", None)
        if headers is not None and headers.get("User-Agent", "").startswith(PROBE_AGENT):
            return
        log(self, fmt, *args)

    handler.log_message = log_message


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: python -m clusterctl.serve.rank MODELS_JSON [SERVER ARGUMENTS...]")
    model = model_for(argv[1], rank())
    from mlx_lm import server

    tolerate_missing_hub_cache(server)
    quiet_probes(server)
    sys.argv = ["mlx_lm.server", "--model", model, *argv[2:]]
    server.main()


if __name__ == "__main__":
    main(sys.argv)
