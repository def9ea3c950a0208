"""The dashboard's web application (Starlette, an ASGI framework; served by uvicorn, cli/dashboard.py).

    app = build(board, token)

Every request but the static files (the page's script, style and chart library: code, no data) must carry the
token, `?token=` in the URL or the X-Clusterctl-Token header; anything else is answered 403. The page reads the
token from its own URL and sends it with each request.

    GET  /?token=T                       the page (static/index.html)
    GET  /api/overview?token=T           hosts, the cluster picture, runs, endpoints (Board.overview)
    GET  /api/run/ID?token=T             one run: its record, each rank's curve, held-out loss, stacks
    GET  /api/stream?token=T[&run=ID]    Server-Sent Events: "overview" every interval, and "run" for ID
    POST /api/chat/{id}?token=T          {"messages": [...]} -> the served model's answer (Board.chat)

Reading files and asking endpoints happen in worker threads (starlette.concurrency), so one slow endpoint never
holds the page's other requests.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import math
import os
import time

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..errors import ClusterctlError
from .state import Board

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
TOKEN_HEADER = "x-clusterctl-token"
STREAM_S = 2.0              # how often the stream sends the overview (and the watched run)
MAX_CHAT_BYTES = 64 * 1024


class TokenGuard:
    """ASGI middleware: a request without the token is answered 403, before any route sees it (the static files
    excepted: the page's code and the chart library, no data)."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not scope["path"].startswith("/static/"):
            request = Request(scope)
            given = request.query_params.get("token") or request.headers.get(TOKEN_HEADER) or ""
            if not hmac.compare_digest(given.encode(), self.token):
                answer = PlainTextResponse("403: this page needs the token in the URL `clusterctl dashboard` printed\n",
                                           status_code=403)
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Answer(JSONResponse):
    """JSON with NaN and infinities as null (a diverged loss), which JSON itself cannot say."""

    def render(self, content) -> bytes:
        return json.dumps(finite(content), separators=(",", ":")).encode()


def finite(value):
    """`value` with every non-finite float replaced by None (pure)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def build(board: Board, token: str, stream_s: float = STREAM_S, stopping=lambda: False) -> Starlette:
    """The application; `stopping()` says the server is stopping, which ends every open stream at once (a page
    reconnects to the next dashboard by itself)."""
    async def page(request: Request):
        return FileResponse(os.path.join(STATIC, "index.html"), headers={"Cache-Control": "no-store"})

    async def overview(request: Request):
        return Answer(await run_in_threadpool(board.overview))

    async def one_run(request: Request):
        try:
            return Answer(await run_in_threadpool(board.run, request.path_params["run_id"]))
        except ClusterctlError as e:
            return Answer({"error": str(e)}, status_code=404)

    async def chat(request: Request):
        body = await request.body()
        if len(body) > MAX_CHAT_BYTES:
            return Answer({"error": f"a chat request is at most {MAX_CHAT_BYTES} bytes"}, status_code=413)
        try:
            messages = json.loads(body).get("messages")
        except (ValueError, AttributeError):
            return Answer({"error": 'expected {"messages": [{"role": "user", "content": "..."}]}'}, status_code=400)
        try:
            return Answer(await run_in_threadpool(board.chat, request.path_params["run_id"], messages))
        except ClusterctlError as e:
            return Answer({"error": str(e)}, status_code=502)

    async def stream(request: Request):
        run_id = request.query_params.get("run")

        async def events():
            board.watch()
            try:
                while not stopping() and not await request.is_disconnected():
                    yield _event("overview", await run_in_threadpool(board.overview))
                    if run_id:
                        try:
                            yield _event("run", await run_in_threadpool(board.run, run_id))
                        except ClusterctlError as e:
                            yield _event("run", {"error": str(e)})
                    due = time.monotonic() + stream_s
                    while time.monotonic() < due and not stopping():
                        await asyncio.sleep(min(0.25, stream_s))
            finally:
                board.unwatch()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return Starlette(routes=[
        Route("/", page),
        Route("/api/overview", overview),
        Route("/api/run/{run_id}", one_run),
        Route("/api/stream", stream),
        Route("/api/chat/{run_id}", chat, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ], middleware=[Middleware(TokenGuard, token=token)])


def _event(name: str, doc: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(finite(doc), separators=(',', ':'))}\n\n"
