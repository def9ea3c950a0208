"""The served endpoint as this machine reaches it: is it ready, is it answering (standard library HTTP).

    endpoint = Endpoint("http://127.0.0.1:8080", on_ready=lambda seconds: ...)
    endpoint.attempt_started()     # each attempt of the job: wait for readiness again, then watch health
    endpoint.answered              # when /health last answered (time.monotonic()): the stall watchdog's progress
    endpoint.stop()

Ready means a one-token completion was answered, not that `/health` answers: mlx-lm's server answers /health
as soon as its HTTP thread runs, while the ranks may still be loading their weights
(docs/facts/mlx-lm.md#health-answers-before-the-model-is-loaded). Once ready, /health is asked every HEALTH_S.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

HEALTH_S = 5.0            # how often /health is asked once the endpoint is ready
HEALTH_TIMEOUT_S = 10.0   # a health answer slower than this is no answer
READY_TRY_S = 300.0       # one readiness request may wait this long for its token (the first pays for the load)
RETRY_S = 0.5             # between readiness tries that found nothing listening yet
PROBE_AGENT = "clusterctl-probe"     # the User-Agent of these requests: the ranks leave them out of their log (rank.py)


def request(url: str, path: str, body: dict | None = None, timeout: float = HEALTH_TIMEOUT_S) -> tuple[int, bytes]:
    """(HTTP status, body) of GET (or POST of `body` as JSON) url+path; OSError when nothing answers."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"User-Agent": PROBE_AGENT, **({"Content-Type": "application/json"} if data else {})}
    req = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def healthy(url: str, timeout: float = HEALTH_TIMEOUT_S) -> bool:
    try:
        status, body = request(url, "/health", timeout=timeout)
    except (OSError, ValueError):
        return False
    return status == 200 and _json(body).get("status") == "ok"


def one_token(url: str, timeout: float = READY_TRY_S) -> bool:
    """Whether the endpoint answers a one-token text completion (what readiness means)."""
    try:
        status, body = request(url, "/v1/completions", {"prompt": "Hello", "max_tokens": 1, "temperature": 0.0},
                               timeout=timeout)
    except (OSError, ValueError):
        return False
    return status == 200 and bool(_json(body).get("choices"))


def model_ids(url: str, timeout: float = HEALTH_TIMEOUT_S) -> list[str]:
    """The ids GET /v1/models lists."""
    status, body = request(url, "/v1/models", timeout=timeout)
    data = _json(body).get("data") if status == 200 else None
    return [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []


def _json(body: bytes) -> dict:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Endpoint:
    """Readiness, then health, of one URL, watched by one thread per attempt of the job."""

    def __init__(self, url: str, on_ready: Callable[[float], None], health_s: float = HEALTH_S):
        self.url, self.on_ready, self.health_s = url, on_ready, health_s
        self.answered: float | None = None        # the current attempt's last health answer
        self._attempt = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def attempt_started(self) -> None:
        """A new attempt started its ranks: forget the last one's answers, wait for this one to be ready."""
        with self._lock:
            self._attempt += 1
            self.answered = None
            attempt = self._attempt
        threading.Thread(target=self._watch, args=(attempt, time.monotonic()), name=f"endpoint-{attempt}",
                         daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _current(self, attempt: int) -> bool:
        return attempt == self._attempt and not self._stop.is_set()

    def _watch(self, attempt: int, started: float) -> None:
        while self._current(attempt):
            tried = time.monotonic()
            if one_token(self.url):
                break
            self._stop.wait(max(0.0, RETRY_S - (time.monotonic() - tried)))
        else:
            return
        now = time.monotonic()
        with self._lock:
            if attempt != self._attempt:
                return
            self.answered = now
        self.on_ready(now - started)
        while not self._stop.wait(self.health_s) and self._current(attempt):
            if healthy(self.url):
                with self._lock:
                    if attempt == self._attempt:
                        self.answered = time.monotonic()
