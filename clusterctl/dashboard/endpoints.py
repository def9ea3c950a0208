"""The running serves' endpoints as the dashboard reaches them over HTTP (serve/endpoint.py's client): which are
running (the runs index), their health (asked by the sampler's thread every HEALTH_S while a page is open) and the
page's chat, asked of one of them.

    running()                           # run id -> {"url", "model", "dir"} of every serve running now
    health = HealthPoller(); health.poll(); health.health()      # run id -> {"healthy", "checked"}
    ChatProxy().ask(run_id, messages)   # the served model's answer
"""
from __future__ import annotations

import json
import threading
import time

from ..errors import UsageError
from ..observe import runs as registry

HEALTH_S = 5.0              # how often the endpoints' health is asked while a page is open
HEALTH_TIMEOUT_S = 2.0
CHAT_TIMEOUT_S = 120.0
CHAT_MAX_TOKENS = 256


def running(index: dict[str, dict] | None = None) -> dict[str, dict]:
    """run id -> {"url", "model", "dir"} of every `clusterctl serve` that is running now (from `index`, the runs
    index already read, when given)."""
    return {run_id: {"url": entry["service"]["url"], "model": entry["service"].get("model"), "dir": entry["dir"]}
            for run_id, entry in registry.services(index=index).items()
            if isinstance(entry.get("dir"), str) and "exit_code" not in entry and registry.run_alive(entry["dir"])}


class HealthPoller:
    """Each running endpoint's health: poll() asks every one's /health (the sampler's job), health() is the last
    answers."""

    def __init__(self):
        self._lock = threading.Lock()
        self._health: dict[str, dict] = {}

    def poll(self) -> None:
        from ..serve.endpoint import healthy
        health = {}
        for run_id, service in running().items():
            health[run_id] = {"healthy": healthy(service["url"], HEALTH_TIMEOUT_S), "checked": time.time()}
        with self._lock:
            self._health = health

    def health(self) -> dict[str, dict]:
        with self._lock:
            return dict(self._health)


class ChatProxy:
    """The page's chat, asked of the endpoint a running `clusterctl serve` recorded: only those endpoints, only their
    own model."""

    def ask(self, run_id: str, messages: list) -> dict:
        """The served model's answer to `messages` (OpenAI chat format): {"content", "model", "usage"}."""
        service = running().get(run_id)
        if service is None:
            raise UsageError(f"no running endpoint for run {run_id!r}")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str) for m in messages):
            raise UsageError("messages: a list of {role, content}")
        from ..serve.endpoint import request
        body = {"model": service["model"], "messages": messages, "max_tokens": CHAT_MAX_TOKENS}
        try:
            status, answer = request(service["url"], "/v1/chat/completions", body, timeout=CHAT_TIMEOUT_S)
        except OSError as e:
            raise UsageError(f"the endpoint {service['url']} did not answer: {e}") from None
        try:
            doc = json.loads(answer)
        except ValueError:
            doc = {}
        if status != 200:
            raise UsageError(f"the endpoint answered {status}: {answer[:200].decode('utf-8', 'replace')}")
        try:
            text = doc["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise UsageError("the endpoint's answer has no message") from None
        return {"content": text, "model": doc.get("model"), "usage": doc.get("usage")}
