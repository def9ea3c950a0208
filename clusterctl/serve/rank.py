"""What every rank of `clusterctl serve` runs on its host: mlx-lm's server on that host's copy of the model.

    python -m clusterctl.serve.rank SPEC_JSON [SERVER ARGUMENTS...]

SPEC_JSON is {"name": the model's name, "models": [rank by rank, the model's directory in that rank's host's
store]} (`serve` pushed it there; each host's store may be elsewhere, e.g. under another home directory).
Standard library and mlx-lm only: it runs on the hosts, from the copy of clusterctl `serve` ships to each
(<workdir>/.clusterctl/lib). Before mlx-lm's own main() it:
  - gives the server `--model` with this rank's directory;
  - turns the Hugging Face hub off (HF_HUB_OFFLINE=1): nothing a rank loads is ever looked up or downloaded;
  - admits only requests for the served model (admit): mlx-lm loads whatever a request's `model`, `adapters` or
    `draft_model` names, from a path of the host or from the hub, in place of the served model
    (docs/facts/mlx-lm.md#a-request-loads-whatever-it-names). A request
    naming another model, or any adapter or draft model, is answered 404 naming the served one on rank 0, before
    mlx-lm reads it; every other request reaches mlx-lm naming the model by its served name, which is what the
    reply echoes (mlx-lm's own default is the word "default_model");
  - makes every rank take that name, and every rank's directory, as the model it holds
    (docs/facts/mlx-lm.md#a-request-names-the-model-on-every-rank): mlx-lm passes the request's `model` to
    every rank, and a rank that does not know the name as its model loads that name as another model;
  - answers `GET /v1/models` with the served model under its name. mlx-lm's own answer lists the models of the
    host's Hugging Face cache, and is an empty body where the host has no cache directory (its scan raises
    after the 200 status line: mlx-lm issue 1636, docs/facts/mlx-lm.md#v1-models-without-a-hub-cache); a model
    from that cache could not be served across the hosts anyway;
  - leaves clusterctl's own health and readiness requests (User-Agent PROBE_AGENT) out of the server's request
    log: `serve` asks /health every few seconds, which would otherwise be most of what the ranks print.
"""
import io
import json
import os
import sys

PROBE_AGENT = "clusterctl-probe"      # serve/endpoint.py sends it
MLX_DEFAULT = "default_model"         # mlx-lm's own name for the model it was started with


def rank() -> int:
    """This rank's number, from whichever launcher started it (mpirun or MLX's ring / jaccl)."""
    for name in ("OMPI_COMM_WORLD_RANK", "MLX_RANK", "PMI_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def read_spec(spec_json: str) -> tuple[str, list[str]]:
    """(the model's name, every rank's model directory), checked."""
    try:
        spec = json.loads(spec_json)
    except ValueError:
        spec = None
    name = spec.get("name") if isinstance(spec, dict) else None
    models = spec.get("models") if isinstance(spec, dict) else None
    if not isinstance(name, str) or not name or not isinstance(models, list) or not models \
            or not all(isinstance(m, str) and m for m in models):
        raise SystemExit('clusterctl.serve.rank: SPEC_JSON must be {"name": NAME, "models": [PATH, ...]}, '
                         f"not {spec_json!r}")
    return name, models


def model_for(models: list[str], my_rank: int) -> str:
    """This rank's model directory (the last entry for a rank past the list), ~ expanded, resolved."""
    path = os.path.realpath(os.path.expanduser(models[min(my_rank, len(models) - 1)]))
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise SystemExit(f"clusterctl.serve.rank: {path}: no model there (no config.json)")
    return path


def known_as(server, names: list[str]) -> None:
    """Every rank serves a request naming the model by any of `names` with the model it loaded (mlx-lm's
    ModelProvider maps a request's model through _model_map before deciding whether to load another)."""
    provider = server.ModelProvider
    init = provider.__init__

    def __init__(self, cli_args, *args, **kwargs):
        init(self, cli_args, *args, **kwargs)
        for name in names:
            self._model_map.setdefault(name, self._model_map["default_model"])
            self._adapter_map.setdefault(name, self._adapter_map.get("default_model"))

    provider.__init__ = __init__


def admit(body, name: str, names: set[str]) -> tuple[object, dict | None]:
    """(the request body as mlx-lm may see it, None), or (None, the OpenAI error of a 404: why not, in one line, and
    the field). A JSON object passes when its `model` is absent, null, or one of `names`, and it names no `adapters`
    and no `draft_model`; it then names the model `name`. Anything else passes as it is (mlx-lm refuses what is not
    a JSON object)."""
    if not isinstance(body, dict):
        return body, None
    model = body.get("model")
    if model is not None and not (isinstance(model, str) and model in names):
        return None, _not_found("model", f"model {json.dumps(model)} is not served here: this endpoint serves only "
                                         f"{json.dumps(name)} (name it, or leave out model)")
    for key in ("adapters", "draft_model"):
        if body.get(key) is not None:
            return None, _not_found(key, f"this endpoint loads no {key}: it serves only {json.dumps(name)} as it is "
                                         f"(leave out {key})")
    fetched = next(_fetched_images(body.get("messages")), None)
    if fetched is not None:
        return None, {"message": f"this endpoint fetches nothing from the network ({json.dumps(fetched[:80])}): give "
                                 "the image inline, as a data: URL", "type": "invalid_request_error",
                      "param": "messages", "code": "url_not_fetched"}
    return {**body, "model": name}, None


def _fetched_images(messages):
    """The http(s) URLs of a chat's image parts, which mlx-lm's server would download on rank 0's host
    (docs/facts/mlx-lm.md#a-request-loads-whatever-it-names); inline data: URLs are not among them."""
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            url = part.get("image_url", part.get("image")) if isinstance(part, dict) else None
            url = url.get("url") if isinstance(url, dict) else url
            if isinstance(url, str) and url.lower().startswith(("http://", "https://")):
                yield url


def _not_found(field: str, message: str) -> dict:
    return {"message": message, "type": "invalid_request_error", "param": field, "code": "model_not_found"}


def admit_requests(server, name: str, names: set[str]) -> None:
    """Every POST passes admit() before mlx-lm's handler reads it: a refused one is answered 404 with an OpenAI
    error naming the served model, an admitted one reaches mlx-lm with the served name as its model."""
    handler = server.APIHandler
    post = handler.do_POST

    def do_POST(self):
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():            # mlx-lm answers it (411, 400) without reading a body
            return post(self)
        raw = self.rfile.read(int(length))
        try:
            body = json.loads(raw.decode())
        except ValueError:                  # not JSON (UnicodeDecodeError is one): mlx-lm answers 400
            body = None
        admitted, error = admit(body, name, names)
        if error is not None:
            self._set_completion_headers(404 if error["code"] == "model_not_found" else 400)
            self.end_headers()
            self.wfile.write(json.dumps({"error": error}).encode())
            return
        if admitted is not body:
            raw = json.dumps(admitted).encode()
            self.headers.replace_header("Content-Length", str(len(raw)))
        rfile, self.rfile = self.rfile, io.BytesIO(raw)
        try:
            post(self)
        finally:
            self.rfile = rfile

    handler.do_POST = do_POST


def list_served(server, name: str) -> None:
    """GET /v1/models[/ID]: the served model, under its name (what a client then sends back as `model`)."""
    def handle_models_request(self):
        wanted = "/".join(self.path.split("/")[3:]) or None
        models = [{"id": name, "object": "model", "created": self.created, "owned_by": "clusterctl"}]
        self._set_completion_headers(200)
        self.end_headers()
        self.wfile.write(json.dumps({"object": "list",
                                     "data": [m for m in models if wanted in (None, m["id"])]}).encode())
        self.wfile.flush()

    server.APIHandler.handle_models_request = handle_models_request


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
        raise SystemExit("usage: python -m clusterctl.serve.rank SPEC_JSON [SERVER ARGUMENTS...]")
    name, models = read_spec(argv[1])
    model = model_for(models, rank())
    os.environ["HF_HUB_OFFLINE"] = "1"        # before huggingface_hub is imported: it reads it once
    from mlx_lm import server

    names = [name, *models, *(os.path.realpath(os.path.expanduser(m)) for m in models)]
    known_as(server, names)
    admit_requests(server, name, {*names, MLX_DEFAULT})
    list_served(server, name)
    quiet_probes(server)
    sys.argv = ["mlx_lm.server", "--model", model, *argv[2:]]
    server.main()


if __name__ == "__main__":
    main(sys.argv)
