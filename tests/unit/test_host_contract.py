"""The controller and the programs it runs on hosts agree (hosts/scripts/contract.py, hosts/hostscript.py;
CONTRIBUTING.md#adding-a-host-script): every name, mark and word both sides write is the contract's, written once
and imported by both sides; every script reaches a host as one self-contained text; and a script run through
hostscript, as a host runs it, gets its arguments exactly as given, however hostile, and gives its answer back."""
import ast
import json
import os
import queue
import sys

import pytest

from clusterctl.hosts import hostscript, scripts
from clusterctl.hosts.local import LocalTransport
from clusterctl.hosts.scripts import contract
from clusterctl.hosts.transport import read_until

PACKAGE = os.path.dirname(os.path.abspath(scripts.__file__)).rsplit(os.sep, 2)[0]
SCRIPTS = os.path.join(PACKAGE, "hosts", "scripts")
WORDS = {name: value for name, value in vars(contract).items() if name.isupper() and isinstance(value, str)}
NAMES = {name for name, value in vars(contract).items() if name.isupper() or callable(value) and name[0] != "_"}

# The ways of running something on a host that do not go through hostscript, each for its reason
# (hostscript's docstring): module -> the texts of hosts/scripts/ it takes itself.
OTHER_WAYS = {
    "clusterctl/hosts/remote.py": "watchdog.sh: the shell around every command, values as its parameters",
    "clusterctl/hosts/probe.py": "python_info.py: a value of probe.sh, which finds the python and runs it",
    "clusterctl/launch/bootstrap.py": "bootstrap.py, envfiles.py: on the launcher's command line, every rank",
    "clusterctl/launch/backends/rankstarter.py": "ranks.py: uploaded with its 0600 spec, the launcher runs it",
}


def sources():
    for directory, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                yield os.path.relpath(path, os.path.dirname(PACKAGE)), ast.parse(open(path, encoding="utf-8").read())


def literals(tree):
    """Every string a module writes (docstrings aside), a sum of literals ("a" + "b") as one."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and all(
                isinstance(side, ast.Constant) and isinstance(side.value, str) for side in (node.left, node.right)):
            yield node.lineno, node.left.value + node.right.value
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def copies(tree):
    """(line, contract name) for each literal that spells a contract word (a long one anywhere in a string)."""
    return [(line, name) for line, text in literals(tree) for name, word in WORDS.items()
            if text == word or (len(word) >= 8 and word in text)]


def contract_imports(rel, tree):
    """The names a module takes from the contract."""
    module = rel[:-3].replace(os.sep, ".")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[:len(module.split(".")) - node.level]
                base = ".".join(parts + ([node.module] if node.module else []))
            if base == "clusterctl.hosts.scripts.contract":
                found |= {alias.name for alias in node.names}
    return found


def test_no_contract_word_is_written_anywhere_but_the_contract():
    written = {rel: copies(tree) for rel, tree in sources() if not rel.endswith(os.path.join("scripts", "contract.py"))}
    assert {rel: found for rel, found in written.items() if found} == {}


def test_the_check_finds_a_word_written_again():
    bad = ast.parse('"""supervisor.log: a docstring may say it"""\nX = ".clusterctl-" + "tmp-"\n'
                    'def f(d):\n    return d + "/supervisor.log", f"{d}link:", "ready", "\\x1eclusterctl-live " + d\n')
    assert sorted(copies(bad)) == [(2, "TMP"), (4, "LINK"), (4, "LIVE_MARK"), (4, "READY"), (4, "SUPERVISOR_LOG")]


def test_both_sides_import_every_word_and_no_script_defines_one_again():
    scripts_side, controller_side = set(), set()
    for rel, tree in sources():
        taken = contract_imports(rel, tree)
        in_scripts = rel.startswith(os.path.join("clusterctl", "hosts", "scripts"))
        (scripts_side if in_scripts else controller_side).update(taken)
        if in_scripts and not rel.endswith("contract.py"):
            defined = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                       for target in node.targets if isinstance(target, ast.Name)}
            defined |= {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
            assert not defined & NAMES, (rel, defined & NAMES)      # inlined beside the contract: one meaning each
    constants = {name for name in NAMES if name.isupper()}
    assert constants - scripts_side == set() and constants - controller_side == set()


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(SCRIPTS) if n.endswith(".py") and n != "__init__.py"))
def test_every_script_reaches_a_host_as_one_text_with_the_contract_in_it(name):
    text = scripts.program(name)
    relative = [node.module for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ImportFrom) and node.level]
    assert relative == [], (name, relative)         # a sibling import program() missed would fail on the host
    carried = text.count(scripts.script_text("contract.py"))
    assert carried <= 1 and (carried == 1 or "from .contract import" not in scripts.script_text(name))  # or a piece's


def test_the_controller_runs_scripts_only_through_hostscript():
    """A text of hosts/scripts/ taken by hand (program, script_text) only where hostscript says why it cannot be."""
    takers = {}
    for rel, tree in sources():
        if rel.startswith(os.path.join("clusterctl", "hosts", "scripts")) or rel.endswith("hostscript.py"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("scripts") and \
                    {a.name for a in node.names} & {"program", "script_text"}:
                takers[rel.replace(os.sep, "/")] = node.lineno
    assert set(takers) <= set(OTHER_WAYS), set(takers) - set(OTHER_WAYS)


# ---- a round trip, as a host runs it ----------------------------------------------------------------------

ECHO = ("import os\nimport sys\n\nfrom .contract import TOKEN_ENV, read_request, reply\n\n"
        "if __name__ == '__main__':\n"
        "    reply({'args': sys.argv[1:], 'request': read_request(sys.argv[1]), 'secret': os.environ.get(TOKEN_ENV),\n"
        "           'cwd_has': sorted(os.listdir('.'))})\n")
ECHO_SH = 'printf "%s\\n" "$A" "$B" "$#"; for a in "$@"; do printf "[%s]\\n" "$a"; done\n'


@pytest.fixture
def echo(monkeypatch):
    """A script `echo.py` (and `echo.sh`) among hosts/scripts/, for this test only."""
    real = scripts.script_text
    texts = {"echo.py": ECHO, "echo.sh": ECHO_SH}
    monkeypatch.setattr(scripts, "script_text", lambda name: texts[name] if name in texts else real(name))
    monkeypatch.setattr(hostscript, "script_text", scripts.script_text)
    scripts.program.cache_clear()
    yield
    scripts.program.cache_clear()


def hostile(tmp_path):
    return ["it's", '"; touch ' + str(tmp_path / "pwned1") + '; "', f"$(touch {tmp_path / 'pwned2'})",
            f"`touch {tmp_path / 'pwned3'}`", "a\nb\n", "~", "*", "--", "-c", "$HOME", "back\\slash", "é ü", "",
            "'\"'\"'", "%s %b \\0134", "; exit 3"]


def test_a_script_gets_its_arguments_intact_and_its_answer_comes_back(echo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    values = hostile(tmp_path)
    request = {"root": "$(touch pwned4)", "list": values}
    result = hostscript.run(LocalTransport("here"), sys.executable, "echo.py", json.dumps(request), *values,
                            timeout=60, env={contract.TOKEN_ENV: "s3cret'$(touch pwned5)"})
    assert result.ok, result.stderr
    answer = hostscript.answer(result)
    assert answer["args"] == [json.dumps(request), *values]
    assert answer["request"] == request and answer["secret"] == "s3cret'$(touch pwned5)"
    assert answer["cwd_has"] == [] and os.listdir(tmp_path) == []          # nothing ran: no file was made


def test_a_streamed_script_reads_the_same_and_its_lines_are_messages(echo, tmp_path):
    values = hostile(tmp_path)
    lines: queue.Queue = queue.Queue()
    proc = hostscript.start(LocalTransport("here"), sys.executable, "echo.py", "[1, 2]", *values, lines=lines)
    out, err, done = read_until(proc, lines, 60)
    assert done and hostscript.message(out[-1])["args"] == ["[1, 2]", *values], err
    assert os.listdir(tmp_path) == []


def test_a_script_without_its_answer_says_how_it_ended(tmp_path):
    result = hostscript.run(LocalTransport("here"), sys.executable, "missing.py", "json", "clusterctl_no_such_module",
                            timeout=60)
    assert hostscript.answer(result) == ["clusterctl_no_such_module"]
    broken = hostscript.run(LocalTransport("here"), str(tmp_path / "no python"), "missing.py", timeout=60)
    with pytest.raises(hostscript.NoAnswer, match=r"could not read its answer \(status 127\): .*no python"):
        hostscript.answer(broken)


def test_the_python_keeps_a_leading_tilde_as_the_host_home_and_every_other_word_is_quoted():
    text = hostscript.command("~/venv/bin/python", "missing.py", "a b", "$(x)")
    assert text.startswith('"$HOME"/venv/bin/python -c \'') and text.endswith(" 'a b' '$(x)'")


def test_a_shell_script_gets_its_values_and_parameters_intact(echo, tmp_path):
    values = hostile(tmp_path)
    text = hostscript.shell("echo.sh", {"A": values[1], "B": hostscript.HostPath("~/x y")}, values)
    result = LocalTransport("here").run(text, 60)
    lines = result.stdout.split("\n")
    assert lines[0] == values[1] and lines[1] == os.path.expanduser("~/x y") and lines[2] == str(len(values))
    assert result.stdout.split("\n", 3)[3] == "".join(f"[{v}]\n" for v in values)
    assert os.listdir(tmp_path) == []


# ---- the words inside the answers ---------------------------------------------------------------------------

STATES = {name: value for cls in (contract.SupervisorState, contract.StoreState)
          for name, value in vars(cls).items() if name.isupper() and isinstance(value, str)}


def _is_state(node, names=frozenset()) -> bool:
    """An answer's "state": d["state"], d.get("state"), or a name given one of these (`names`)."""
    key = lambda n: isinstance(n, ast.Constant) and n.value == "state"       # noqa: E731
    return (isinstance(node, ast.Subscript) and key(node.slice)) or (isinstance(node, ast.Name) and node.id in names) \
        or (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and key(node.args[0]))


def state_words(tree):
    """(line, word) for each state word an answer is built with or compared to as a literal, not the contract's."""
    def words(node):
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [n.value for n in items if isinstance(n, ast.Constant) and n.value in STATES.values()]
    found = []
    names = frozenset(t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _is_state(node.value)
                      for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            found += [(node.lineno, w) for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and k.value == "state" for w in words(v)]
            found += [(node.lineno, w) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)
                      and k.value == "state" and isinstance(v, ast.IfExp) for w in words(v.body) + words(v.orelse)]
        elif isinstance(node, ast.Compare) and any(_is_state(side, names) for side in [node.left, *node.comparators]):
            found += [(node.lineno, w) for side in [node.left, *node.comparators] for w in words(side)]
    return found


def test_the_states_in_the_scripts_answers_are_the_contracts_on_both_sides():
    written = {rel: state_words(tree) for rel, tree in sources() if not rel.endswith(os.path.join("scripts", "contract.py"))}
    assert {rel: found for rel, found in written.items() if found} == {}
    taken = {rel: contract_imports(rel, tree) for rel, tree in sources()}
    for cls in ("SupervisorState", "StoreState"):
        users = {rel for rel, names in taken.items() if cls in names}
        assert any("scripts" in rel for rel in users) and any("scripts" not in rel for rel in users), (cls, users)


def test_the_states_check_finds_a_word_written_again():
    bad = ast.parse('def f(d, state):\n    now = d.get("state")\n    if state == "running" or now in ("ended", "lost"):\n'
                    '        return {"state": "complete" if d else "partial"}\n    return d["state"] != "x", d["x"] == "lost"\n')
    assert sorted(state_words(bad)) == [(3, "ended"), (3, "lost"), (4, "complete"), (4, "partial")]


def test_the_supervisors_states_come_back_as_the_contract_names_them(tmp_path):
    """follow.py's `state`, run as a host runs it, on a supervisor that ended, one that is lost, one that runs, and
    a folder that is not there."""
    import subprocess
    import time

    from clusterctl.hosts.scripts.proctime import start_time

    def asked(folder):
        result = hostscript.run(LocalTransport("here"), sys.executable, "follow.py", str(folder), "state", timeout=60)
        return hostscript.answer(result)["state"]

    S = contract.SupervisorState
    ended, lost, running = (tmp_path / n for n in ("ended", "lost", "running"))
    for folder in (ended, lost, running):
        folder.mkdir()
    (ended / "exit.json").write_text(json.dumps({"code": 0, "ended": time.time()}))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (lost / "supervisor.pid").write_text(f"{gone.pid} 1")
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (running / "supervisor.pid").write_text(f"{alive.pid} {start_time(alive.pid) or ''}")
        assert [asked(f) for f in (ended, lost, running, tmp_path / "none")] == [S.ENDED, S.LOST, S.RUNNING, S.UNKNOWN]
    finally:
        alive.kill()
        alive.wait()


# ---- the keys of the answers ------------------------------------------------------------------------------

SHAPES = contract.Answer.SHAPES


def written_keys(tree):
    """(line, key) for each key a script's dicts are built with: a literal's constant keys, dict(KEY=...)'s, and
    d["key"] = ... (a module's UPPERCASE table aside: a mapping of its own, not an answer)."""
    tables = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
              and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)}
    environments = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and "environ" in ast.dump(node.value)
                    for t in node.targets if isinstance(t, ast.Name)}      # a copy of os.environ: no answer
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and id(node) not in tables:
            found += [(node.lineno, k.value) for k in node.keys if isinstance(k, ast.Constant)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            found += [(node.lineno, k.arg) for k in node.keywords if k.arg]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and isinstance(node.slice, ast.Constant) \
                and getattr(node.value, "id", None) not in environments:
            found.append((node.lineno, node.slice.value))
        elif isinstance(node, ast.Tuple) and isinstance(node.ctx, ast.Store):      # a["x"], a["y"] = ...
            found += [(node.lineno, e.slice.value) for e in node.elts
                      if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant)]
    return found


def _answer_call(node, proxies=frozenset()) -> bool:
    """hostscript.answer(...) or .message(...) (either side of an if-else), or a call of a function that returns
    one (`proxies`: module.function, as `supervisor.state`)."""
    if isinstance(node, ast.IfExp):
        return _answer_call(node.body, proxies) or _answer_call(node.orelse, proxies)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)):
        return False
    return (node.func.value.id == "hostscript" and node.func.attr in ("answer", "message")) or \
        f"{node.func.value.id}.{node.func.attr}" in proxies


def _functions(tree):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in node.body if isinstance(n, ast.FunctionDef))


def _ran(fn) -> set:
    return {a.value for node in ast.walk(fn) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("run", "start") and getattr(node.func.value, "id", "") == "hostscript"
            for a in node.args if isinstance(a, ast.Constant) and str(a.value).endswith(".py")}


def answer_proxies(rel, tree) -> dict:
    """{"module.function": script} for each top-level function of a module that runs one script and returns its
    answer as it is (detach/supervisor.py's state): its callers read that script's answer."""
    stem = os.path.basename(rel)[:-3]
    return {f"{stem}.{fn.name}": next(iter(_ran(fn))) for fn in tree.body if isinstance(fn, ast.FunctionDef)
            and len(_ran(fn)) == 1 and any(isinstance(n, ast.Return) and _answer_call(n.value) for n in ast.walk(fn))}


def read_keys(tree, proxies=None):
    """{script: [(line, key)]}: the keys each function or method reads of the answer of the script it runs
    (hostscript.run or start with the script's name) or of a proxy's (answer_proxies: {"module.function": script}):
    d["key"], d.get("key") and "key" in d, where d is the answer, a name given it or a loop's name over it."""
    proxies = proxies or {}
    found = {}
    for fn in _functions(tree):
        called = {f"{n.func.value.id}.{n.func.attr}" for n in ast.walk(fn) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)}
        ran = _ran(fn) | {script for name, script in proxies.items() if name in called}
        if len(ran) != 1:
            continue
        asked = frozenset(name for name, script in proxies.items() if script in ran)
        _answer = lambda n: _answer_call(n, asked)      # noqa: E731
        names = {t.id for node in ast.walk(fn) if isinstance(node, ast.Assign) and _answer(node.value)
                 for t in node.targets if isinstance(t, ast.Name)}
        names |= {node.target.id for node in ast.walk(fn) if isinstance(node, ast.For)
                  and isinstance(node.target, ast.Name) and getattr(node.iter, "id", None) in names}
        is_answer = lambda n: (isinstance(n, ast.Name) and n.id in names) or _answer(n)     # noqa: E731
        keys = []
        for node in ast.walk(fn):
            if isinstance(node, ast.Subscript) and is_answer(node.value) and isinstance(node.slice, ast.Constant):
                keys.append((node.lineno, node.slice.value))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and is_answer(node.func.value) and node.args and isinstance(node.args[0], ast.Constant):
                keys.append((node.lineno, node.args[0].value))
            elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and any(
                    isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(map(is_answer, node.comparators)):
                keys.append((node.lineno, node.left.value))
        found.setdefault(ran.pop(), []).extend(keys)
    return found


def test_every_key_a_script_answers_with_is_its_shapes_in_the_contract():
    for name, shape in SHAPES.items():
        written = written_keys(ast.parse(scripts.script_text(name)))
        assert written and {key for _, key in written} <= set(shape), (name, [w for w in written if w[1] not in shape])


def test_every_key_the_controller_reads_of_an_answer_is_in_its_scripts_shape():
    controller = [(rel, tree) for rel, tree in sources() if not rel.startswith(os.path.join("clusterctl", "hosts", "scripts"))]
    proxies = {name: script for rel, tree in controller for name, script in answer_proxies(rel, tree).items()}
    assert "supervisor.state" in proxies, proxies
    read = {}
    for rel, tree in controller:
        for script, keys in read_keys(tree, proxies).items():
            read.setdefault(script, []).extend((rel, line, key) for line, key in keys)
    for name, shape in SHAPES.items():
        assert read.get(name), f"no reader of {name}'s answer found: the check no longer sees it"
        assert [r for r in read[name] if r[2] not in shape] == [], name


def test_the_keys_checks_find_a_key_out_of_the_shape():
    script = ast.parse('X = {"a": 1}\ndef f(d):\n    d["signal"] = 1\n    reply(dict({"state": 1}, pidd=2))\n')
    assert sorted(written_keys(script)) == [(3, "signal"), (4, "pidd"), (4, "state")]
    controller = ast.parse('def f(t):\n    r = hostscript.run(t, "python", "ports.py", "free", timeout=30)\n'
                           '    a = hostscript.answer(r) if r.ok else None\n    if "freee" in a:\n'
                           '        return a.get("whyy"), hostscript.answer(r)["portt"]\n'
                           '    for e in a:\n        e["x"]\n')
    assert sorted(read_keys(controller)["ports.py"]) == [(4, "freee"), (5, "portt"), (5, "whyy"), (7, "x")]
