"""No class in clusterctl/dashboard/ has more than one of three jobs: starting a thread, being an HTTP client, keeping
a cache (issue 55: the dashboard's Board once sampled in a thread, asked the endpoints over HTTP and kept each run's
curves, all in one class). A class's jobs are read from its own source (its body, its methods, what they nest) with
ast, by these rules:

- thread: it names threading.Thread or threading.Timer, an executor of concurrent.futures (ThreadPoolExecutor,
  ProcessPoolExecutor), _thread.start_new_thread, asyncio.to_thread, starlette's run_in_threadpool, or
  hosts/fanout.py's in_background or Deferred (each a daemon thread).
- HTTP client: it names anything of urllib.request, http.client, requests, httpx, aiohttp or urllib3, or of
  clusterctl.serve.endpoint (this project's client of a served endpoint).
- cache: it names functools' lru_cache, cache or cached_property, or it has an attribute (self.NAME) whose name
  contains "cache", or it fills one of its attributes by key (self.NAME[key] = ..., self.NAME.setdefault(...)): what
  it keeps from one call to the next, under a key.

A name counts by what it resolves to through the module's imports and the class's own (an import inside a method
included, relative imports resolved against the module's package), so `from ..serve.endpoint import request` in a
method and `urllib.request.urlopen` both count; a class that only holds another class's instance has none of that
class's jobs. A job that needs another class is written as that class and composed (dashboard/state.py's Board)."""
import ast
import os
import time

from clusterctl.dashboard import sampler
from clusterctl.dashboard.sampler import Job, Sampler

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "clusterctl")
DASHBOARD = os.path.join(PACKAGE, "dashboard")

THREAD = ("threading.Thread", "threading.Timer", "concurrent.futures.ThreadPoolExecutor",
          "concurrent.futures.ProcessPoolExecutor", "_thread.start_new_thread", "asyncio.to_thread",
          "starlette.concurrency.run_in_threadpool", "clusterctl.hosts.fanout.in_background",
          "clusterctl.hosts.fanout.Deferred")
HTTP = ("urllib.request", "http.client", "requests", "httpx", "aiohttp", "urllib3", "clusterctl.serve.endpoint")
CACHE = ("functools.lru_cache", "functools.cache", "functools.cached_property")


def imports(nodes, package: str) -> dict[str, str]:
    """name bound -> the dotted name it stands for, from the import statements among `nodes`."""
    bound = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    bound[root] = root
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{module}.{alias.name}"
    return bound


def dotted(node) -> str | None:
    """a.b.c of a Name or an Attribute chain on one (None for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id] + parts[::-1])


def names(cls: ast.ClassDef, bound: dict[str, str]) -> set[str]:
    """Every name the class uses, resolved through `bound` (the imports it sees)."""
    used = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.Name, ast.Attribute)) and (name := dotted(node)):
            root, _, rest = name.partition(".")
            if root in bound:
                used.add(bound[root] + ("." + rest if rest else ""))
    return used


def within(name: str, targets) -> bool:
    return any(name == t or name.startswith(t + ".") for t in targets)


def self_attributes(cls: ast.ClassDef) -> tuple[set[str], set[str]]:
    """(every self.NAME the class names, those it fills by key: self.NAME[key] = ..., self.NAME.setdefault(...))."""
    named, keyed = set(), set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            named.add(node.attr)
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Subscript) and (name := dotted(target.value)) and name.startswith("self."):
                    keyed.add(name.split(".")[1])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setdefault" \
                and (name := dotted(node.func.value)) and name.startswith("self."):
            keyed.add(name.split(".")[1])
    return named, keyed


def jobs(source: str, module: str) -> dict[str, set[str]]:
    """class name -> its jobs ({"thread", "http", "cache"}) in the source of `module` (a dotted name: relative imports
    are resolved against its package)."""
    tree = ast.parse(source)
    package = module.rpartition(".")[0]
    found = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        bound = {**imports(tree.body, package), **imports(ast.walk(cls), package)}
        used = names(cls, bound)
        attributes, keyed = self_attributes(cls)
        kinds = set()
        if any(within(n, THREAD) for n in used):
            kinds.add("thread")
        if any(within(n, HTTP) for n in used):
            kinds.add("http")
        if any(within(n, CACHE) for n in used) or keyed or any("cache" in a.lower() for a in attributes):
            kinds.add("cache")
        found[cls.name] = kinds
    return found


def package_jobs() -> dict[str, set[str]]:
    found = {}
    for folder, _, files in os.walk(DASHBOARD):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                with open(path, encoding="utf-8") as f:     # (a package's __init__: its package is itself)
                    found |= {f"{module}.{cls}": kinds for cls, kinds in jobs(f.read(), module).items()}
    return found


def test_no_dashboard_class_has_more_than_one_of_thread_http_client_and_cache():
    found = package_jobs()
    assert {name: kinds for name, kinds in found.items() if len(kinds) > 1} == {}
    # the checker sees each job where it lives: one thread, the HTTP client, the caches
    holders = {kind: sorted(name.rsplit(".", 1)[1] for name, kinds in found.items() if kind in kinds)
               for kind in ("thread", "http", "cache")}
    assert holders == {"thread": ["Sampler"], "http": ["ChatProxy", "HealthPoller"],
                       "cache": ["Curves", "CurvesCache", "EndedRuns"]}, holders
    assert found["clusterctl.dashboard.state.Board"] == set()


BAD = '''
import functools
import threading
import urllib.request

from ..serve.endpoint import healthy


class Everything:
    """A sampler thread, a health poller and a curves cache in one class: what the test must refuse."""

    def __init__(self):
        self._curves = {}
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        return healthy("http://127.0.0.1:8080")

    def curves(self, run_dir):
        return self._curves.setdefault(run_dir, [])


class Chat:
    def ask(self, url):
        with urllib.request.urlopen(url) as answer:
            return answer.read()


class Asker:
    def ask(self, url):
        from ..serve.endpoint import request
        return request(url, "/health")


class Pool:
    def start(self, fn):
        from concurrent.futures import ThreadPoolExecutor
        return ThreadPoolExecutor(2).submit(fn)


class Memo:
    @functools.lru_cache(maxsize=None)
    def value(self, key):
        return key


class Named:
    def __init__(self):
        self.model_cache = None


class Holder:
    """Holds the others: their jobs are not its own."""

    def __init__(self):
        self.chat = Chat()
        self.pool = Pool()
        self.lock = threading.Lock()
'''


def test_the_checker_refuses_a_class_with_several_jobs_and_reads_each_rule():
    found = jobs(BAD, "clusterctl.dashboard.bad")
    assert found == {"Everything": {"thread", "http", "cache"}, "Chat": {"http"}, "Asker": {"http"}, "Pool": {"thread"},
                     "Memo": {"cache"}, "Named": {"cache"}, "Holder": set()}
    # relative imports resolve against the module's own package: from another package, ..serve is not ours
    assert jobs(BAD, "clusterctl.other.sub.bad")["Asker"] == set()
    assert jobs(BAD, "clusterctl.other.bad")["Asker"] == {"http"}


def wait_for(what, condition, limit=20.0):
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_the_sampler_runs_each_job_when_due_while_a_page_watches_and_rests_after(monkeypatch):
    """The one thread Board's jobs share: each run when due while watched, each job's rest once no page has watched
    for IDLE_S, and at the end."""
    monkeypatch.setattr(sampler, "IDLE_S", 0.3)
    calls = []
    jobs = Sampler([Job(lambda: calls.append("hosts"), rest=lambda: calls.append("rest")),
                    Job(lambda: calls.append("health"), every=3600.0)], interval=0.05)
    jobs.watch()
    try:
        wait_for(f"three rounds: {calls}", lambda: calls.count("hosts") >= 3)
        assert calls[:2] == ["hosts", "health"] and calls.count("health") == 1 and "rest" not in calls
        jobs.unwatch()
        wait_for(f"a rest after the last page: {calls}", lambda: "rest" in calls)
        rested = calls.index("rest")
        time.sleep(0.3)
        assert set(calls[rested:]) == {"rest"}, calls
    finally:
        jobs.close()
    assert calls[-1] == "rest" and not jobs._thread.is_alive()
