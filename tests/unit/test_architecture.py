"""The package's structure, read from the source: which part may import which (CONTRIBUTING.md#layout).

    cli -> run / doctor / bench -> launch / transfer -> hosts -> inventory / errors (and the other base modules)
    cli, run -> observe (runs, logs, plots, processes) -> launch / hosts
    cli -> dashboard (the web page) -> observe / serve (its endpoints' health) / launch (the backends) / hosts /
           detach (a detached run's state and curves, from its supervising host)
    cli -> setup (mesh, python) -> doctor / launch / hosts
    cli, setup -> inventory_load (an inventory checked against the backend registry) -> launch
    cli, run, serve, observe, dashboard -> detach (a detached run's supervisor on its host: handoff, start, follow)
           -> transfer / hosts

launch never imports doctor; data and train (which run on the hosts with the standard library and mlx)
import none of hosts, launch, transfer; only cli imports click; cli/ holds no orchestration.
Imports are read with ast, wherever they sit in a module (inside functions too).
"""
import ast
import os
import re
import sys

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "clusterctl")

BASE = {"_version", "errors", "atomic", "figure", "digest", "progress", "trainer_contract", "program", "trainer_program", "resources",
        "inventory_yaml", "inventory", "inventory_edit"}
# what each part may import from clusterctl (besides itself and the base modules)
ALLOWED = {
    "cli": {"run", "doctor", "bench", "launch", "transfer", "hosts", "data", "train", "observe", "setup", "serve",
            "inventory_load", "dashboard", "detach"},
    "dashboard": {"observe", "serve", "launch", "hosts", "detach"},
    "serve": {"run", "launch", "transfer", "hosts", "observe", "detach"},
    "setup": {"doctor", "launch", "transfer", "hosts", "inventory_load"},
    "inventory_load": {"launch"},
    "run": {"launch", "transfer", "hosts", "observe", "detach"},
    "observe": {"launch", "hosts", "detach"},
    "detach": {"hosts", "transfer"},
    "doctor": {"launch", "hosts"},
    "bench": {"launch", "transfer", "hosts"},
    "launch": {"hosts"},
    "transfer": {"hosts", "data"},
    "hosts": set(),
    "data": set(),
    "train": {"data"},
}
ON_HOSTS = {"data", "train"}                    # run on the hosts: stdlib, mlx, numpy, yaml, and these only
# base modules that import nothing but the standard library
ON_HOSTS_BASE = {"_version", "errors", "atomic", "figure", "digest", "progress", "trainer_contract", "program"}
BASE_ORDER = ["_version", "errors", "atomic", "figure", "digest", "progress", "trainer_contract", "program", "trainer_program", "resources",
              "inventory_yaml", "inventory", "inventory_edit"]  # each may import the earlier


def modules():
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                yield rel.removesuffix(".__init__"), path


def imports(module: str, path: str) -> list[tuple[str, int]]:
    """Every clusterctl module (or package) `module` imports, resolved to absolute names, with lines;
    also every top-level third-party name, prefixed with '!'."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    is_package = path.endswith("__init__.py")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name if alias.name.startswith("clusterctl") else "!" + alias.name.split(".")[0],
                              node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if not base.startswith("clusterctl"):
                found.append(("!" + base.split(".")[0], node.lineno))
            elif base == "clusterctl" or node.module is None:   # `from .. import x`: x may be a module
                found += [(f"{base}.{a.name}", node.lineno) for a in node.names if not a.name.startswith("__")]
            else:
                found.append((base, node.lineno))
    return found


def part(module: str) -> str | None:
    """The part of the package a module belongs to: 'cli', 'hosts', ..., a base module's name, or None."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else None


ALL = sorted(modules())


def test_the_tree_is_what_the_rules_speak_of():
    parts = {part(m) for m, _ in ALL} - {None, "__main__"}
    assert parts == set(ALLOWED) | BASE, parts      # a new part or base module must be placed in the rules


@pytest.mark.parametrize("module,path", ALL, ids=[m for m, _ in ALL])
def test_imports_follow_the_dependency_rule(module, path):
    me = part(module)
    if me in (None, "__main__"):
        return
    for target, line in imports(module, path):
        if target.startswith("!"):
            continue
        other = part(target)
        if other is None or other == me:
            continue
        where = f"{path}:{line}: {module} imports {target}"
        if me in BASE:
            assert other in BASE and BASE_ORDER.index(other) < BASE_ORDER.index(me), where
        elif me in ON_HOSTS:
            assert other in ALLOWED[me] or other in ON_HOSTS_BASE, where
        else:
            assert other in ALLOWED[me] or other in BASE, where


def test_launch_never_imports_doctor_and_hosts_stay_below():
    for module, path in ALL:
        targets = [t for t, _ in imports(module, path)]
        if part(module) == "launch":
            assert not any(part(t) == "doctor" for t in targets), module
        if part(module) == "hosts":
            assert not any(part(t) in ("launch", "transfer", "doctor", "run", "bench", "cli") for t in targets), module


def test_only_the_cli_imports_click():
    offenders = [m for m, p in ALL if part(m) != "cli" and ("!click", ) in {(t,) for t, _ in imports(m, p)}]
    assert offenders == []


def test_paramiko_stays_in_the_ssh_layer():
    offenders = [m for m, p in ALL if "!paramiko" in {t for t, _ in imports(m, p)}
                 and m not in ("clusterctl.hosts.ssh", "clusterctl.hosts.sshconfig")]
    assert offenders == []


def test_programs_that_run_on_hosts_need_only_the_standard_library():
    scripts = os.path.join(PACKAGE, "hosts", "scripts")
    for name in os.listdir(scripts):
        if name.endswith(".py") and name != "__init__.py":
            found = {t for t, _ in imports("clusterctl.hosts.scripts." + name[:-3], os.path.join(scripts, name))}
            pieces = {t for t in found if t.startswith("clusterctl.hosts.scripts.")}   # inlined by scripts.program
            third_party = {t for t in found - pieces if not t.startswith("!") or t[1:] not in STDLIB}
            assert third_party <= {"!mlx", "!mpi4py"}, (name, third_party)    # both optional, probed


STDLIB = set(sys.stdlib_module_names)


# ---- cli/: parse, call the core once, print ---------------------------------------------------------

ORCHESTRATION_MODULES = {"!subprocess", "!concurrent", "!queue", "!socket", "!multiprocessing",
                         "!paramiko", "!select"}
ORCHESTRATION_CALLS = {"run_all", "in_background", "Popen", "Thread", "stream", "run_everywhere_in_threads"}


@pytest.mark.parametrize("module,path", [(m, p) for m, p in ALL if part(m) == "cli"],
                         ids=[m for m, _ in ALL if part(m) == "cli"])
def test_the_cli_holds_no_orchestration(module, path):
    assert not ({t for t, _ in imports(module, path)} & ORCHESTRATION_MODULES), module
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            assert name not in ORCHESTRATION_CALLS, f"{path}:{node.lineno}: {name}()"
        if isinstance(node, (ast.For, ast.comprehension)):
            it = node.iter
            assert not (isinstance(it, ast.Attribute) and it.attr == "hosts"), \
                f"{path}:{getattr(node, 'lineno', getattr(it, 'lineno', 0))}: a loop over hosts"


def test_the_rule_checker_catches_a_violation(tmp_path):
    """The checker above is not vacuous: a module that breaks each rule is caught by the same code."""
    bad = tmp_path / "bad.py"
    bad.write_text("from ..doctor import checks\nimport click\nfrom ..hosts.fanout import run_all\n"
                   "def f(cluster):\n    for h in cluster.hosts:\n        run_all([], None, 1)\n")
    found = imports("clusterctl.launch.bad", str(bad))
    assert ("clusterctl.doctor", 1) in found and ("!click", 2) in found
    with pytest.raises(AssertionError, match="clusterctl.launch.bad imports clusterctl.doctor"):
        test_imports_follow_the_dependency_rule("clusterctl.launch.bad", str(bad))
    with pytest.raises(AssertionError, match="run_all|a loop over hosts"):
        test_the_cli_holds_no_orchestration("clusterctl.cli.bad", str(bad))


def test_the_serving_rank_needs_only_the_standard_library_and_mlx_lm():
    # it runs on the hosts, from the copy of clusterctl `serve` ships there (clusterctl/serve/rank.py)
    path = os.path.join(PACKAGE, "serve", "rank.py")
    found = {t for t, _ in imports("clusterctl.serve.rank", path)}
    assert {t for t in found if not t.startswith("!")} == set()
    assert {t[1:] for t in found} - STDLIB <= {"mlx_lm", "huggingface_hub"}


# ---- programs that run on hosts are real files --------------------------------------------------------

def test_the_watchdog_is_a_file_sent_as_it_is_with_its_values_as_arguments():
    """hosts/scripts/watchdog.sh, less its comment and blank lines, is the whole text of the shell every
    remote command runs in, whatever the command, grace, environment or stdin: no value is written into it,
    and no Python module of the package holds a watchdog of its own."""
    import shlex

    from clusterctl.hosts.remote import _READ_ENV, remote_command
    from clusterctl.hosts.scripts import script_text

    body = [line for line in script_text("watchdog.sh").splitlines() if line.strip() and not line.lstrip().startswith("#")]
    sent = set()
    for script, grace, env, stdin in (("true", 2.0, False, False), ("echo 'a b'", 0.5, True, True), ("x", 9, False, True)):
        argv = shlex.split(remote_command(script, grace, env=env, stdin=stdin))
        assert argv[:3] == ["exec", "/bin/sh", "-c"] and argv[4:7] == ["sh", f"{grace:g}", "frames" if stdin else "null"]
        assert argv[7].endswith(script)
        sent.add(argv[3].removeprefix(_READ_ENV) if env else argv[3])
    assert sent == {"\n".join(body) + "\n"}
    holders = [m for m, p in ALL if "exec 3<&0" in open(p, encoding="utf-8").read()]
    assert holders == [], holders


# ---- the supervisor's state is visible ---------------------------------------------------------------

def test_an_attempts_outcome_is_a_frozen_value_of_its_own_module():
    """Outcome and AttemptState live in launch/outcome.py, not in the supervisor's loop; an Outcome is frozen,
    so a later word on it (the sweep's, a restart's) is a copy, and its state is never filled in afterwards."""
    import dataclasses

    from clusterctl.launch.outcome import AttemptState, Outcome

    path = os.path.join(PACKAGE, "launch", "supervise.py")
    defined = {n.name for n in ast.parse(open(path, encoding="utf-8").read()).body if isinstance(n, ast.ClassDef)}
    assert not defined & {"Outcome", "AttemptState"}, defined
    assert Outcome.__module__ == AttemptState.__module__ == "clusterctl.launch.outcome"
    assert Outcome.__dataclass_params__.frozen and not hasattr(Outcome, "__post_init__")
    outcome = Outcome(1, "rank 1 on h2 exited 1", failed_rank=1)
    for name in ("reason", "exit_code", "tail", "ended_as", "rank0_wrote"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(outcome, name, None)
    assert outcome.state is AttemptState.FAILED and Outcome(0, "ok").state is AttemptState.SUCCEEDED
    assert Outcome(130, "x", ended_as=AttemptState.STOPPED).state is AttemptState.STOPPED

# ---- run knows programs by what they can do (program.py's Capabilities), not by name -------------------

MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def compared_names(path: str) -> list[tuple[int, str]]:
    """(line, source) of every comparison in a module that tells programs apart by name: a module (`module`, `x.module`,
    TRAINER_MODULE, a dotted module's name) equal, unequal or in something named or dotted, or `x.module.startswith`.
    (`module is None`, `"/" in module`: a check of the value, not of which program it is.)"""
    def names_a_program(node) -> bool:
        return isinstance(node, ast.Name) and node.id in ("module", "TRAINER_MODULE", "BUNDLED_TRAINER") \
            or isinstance(node, ast.Attribute) and node.attr in ("module", "TRAINER_MODULE") \
            or isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(MODULE_NAME.fullmatch(node.value))

    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Compare) and all(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
            operands = [node.left, *node.comparators]
            if any(map(names_a_program, operands)) and all(
                    names_a_program(o) or isinstance(o, (ast.Name, ast.Attribute, ast.Tuple, ast.List, ast.Set))
                    for o in operands):
                found.append((node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith" \
                and names_a_program(node.func.value):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_run_has_no_branch_on_a_programs_name():
    """What the bundled trainer (or a service) needs, run asks its kind (program.Capabilities); the one place a
    program's module picks its kind is program.kind_of, and only the trainer's kind and contract name its module."""
    run_modules = [(m, p) for m, p in ALL if part(m) == "run"]
    assert {m for m, _ in run_modules} >= {"clusterctl.run", "clusterctl.run.hooks"}
    for module, path in run_modules:
        assert compared_names(path) == [], module
        assert "TRAINER_MODULE" not in open(path, encoding="utf-8").read(), module
    naming = {m for m, p in ALL if re.search(r"\bTRAINER_MODULE\b", open(p, encoding="utf-8").read())}
    assert naming == {"clusterctl.trainer_contract", "clusterctl.trainer_program"}, naming


def test_the_name_check_catches_a_branch_on_the_trainer(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(program, options, module):\n    if program.module == BUNDLED_TRAINER:\n        return 1\n"
                   "    if options.module != 'clusterctl.train':\n        return 2\n"
                   "    if module is None or '/' in module:\n        return 3\n"     # checks of the value: not flagged
                   "    if module in KNOWN:\n        return 4\n"
                   "    return program.module.startswith('clusterctl.')\n")
    assert [line for line, _ in compared_names(str(bad))] == [2, 4, 8, 10]


# ---- one value, one place --------------------------------------------------------------------------------

def literal_defaults(path: str, names: tuple[str, ...], values: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, source) wherever a string in `values` is given to something named in `names` (a parameter's
    default, a field's, an assignment, a keyword argument, click's `default=` of an option so spelled), or passed
    to os.path.join: a default written where it should be read from the one constant that holds it."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = []

    def literal(node) -> bool:
        return isinstance(node, ast.Constant) and node.value in values

    for node in ast.walk(tree):
        if isinstance(node, ast.arguments):
            positional = node.posonlyargs + node.args
            pairs = list(zip(positional[len(positional) - len(node.defaults):], node.defaults))
            pairs += [(a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
            found += [(d.lineno, a.arg) for a, d in pairs if a.arg in names and literal(d)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in names:
            if node.value is not None and literal(node.value):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
            values_ = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for target, value in zip(targets, values_ if len(values_) == len(targets) else [node.value] * len(targets)):
                if isinstance(target, ast.Name) and target.id in names and literal(value):
                    found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call):
            found += [(k.value.lineno, ast.unparse(node)) for k in node.keywords if k.arg in names and literal(k.value)]
            spelled = [a.value.lstrip("-").replace("-", "_") for a in node.args
                       if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--")]
            if set(spelled) & set(names):
                found += [(k.value.lineno, ast.unparse(node)) for k in node.keywords if k.arg == "default" and literal(k.value)]
            if isinstance(node.func, ast.Attribute) and node.func.attr == "join" and any(map(literal, node.args)):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_each_default_is_defined_once_and_named_for_what_it_is():
    """The default backend is the inventory's (DEFAULT_BACKEND, "mpi") and, for a run on this machine without one,
    run's THIS_MACHINE_BACKEND ("ring"); a project's runs directory is trainer_contract.RUNS_DIR. Nowhere else is
    such a value written, and each constant is defined once."""
    definitions = {"DEFAULT_BACKEND": "clusterctl.inventory", "THIS_MACHINE_BACKEND": "clusterctl.run.options",
                   "RUNS_DIR": "clusterctl.trainer_contract"}
    for name, home in definitions.items():
        defined = [m for m, p in ALL if re.search(rf"^{name}\s*=", open(p, encoding="utf-8").read(), re.M)]
        assert defined == [home], (name, defined)
    for module, path in ALL:
        if part(module) == "hosts" and ".scripts." in module:
            continue        # what runs on the hosts stands alone (stackdump.py spells its own directory, cited)
        # (the constants themselves are held above: one definition each, in its home)
        assert literal_defaults(path, ("backend",), ("mpi", "ring")) == [], module
        assert literal_defaults(path, ("runs_dir", "runs_root", "PROTECTED_TOP"), ("runs",)) == [], module


def test_the_default_check_catches_a_default_written_again(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nimport click\nRUNS_DIR = 'runs'\ndef f(backend='ring', runs_dir='runs'):\n"
                   "    backend, line = 'mpi', None\n    return os.path.join('runs', 'x')\n"
                   "o = click.option('--runs-dir', default='runs')\ng(backend='mpi')\n")
    assert sorted(line for line, _ in literal_defaults(str(bad), ("backend",), ("mpi", "ring"))) == [4, 5, 8]
    assert sorted(line for line, _ in literal_defaults(str(bad), ("runs_dir", "RUNS_DIR"), ("runs",))) == [3, 4, 6, 7]


# ---- errors keep their codes -------------------------------------------------------------------------------

def test_the_trainer_and_the_data_raise_no_bare_clusterctl_error():
    """What runs on the hosts says which error it is: bad input (a BadInput, exit 2: DataError, ConfigError,
    UsageError, ...) or a failure of its own kind (WorldSizeMismatch, OutOfSync); a bare ClusterctlError is exit 1
    with no class to say why (the trainer's too-short data was one)."""
    for module, path in ALL:
        if part(module) not in ON_HOSTS:
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                assert name != "ClusterctlError", f"{path}:{node.lineno}"


def test_every_package_of_the_tree_is_in_the_wheel():
    """pyproject.toml lists the packages a wheel holds: a package left out (launch/backends/ was, when it became
    one) is missing from every `pip install .` while an editable install works."""
    text = open(os.path.join(os.path.dirname(PACKAGE), "pyproject.toml"), encoding="utf-8").read()
    section = text.split("[tool.setuptools]", 1)[1]          # (tomllib is 3.11's; the package supports 3.10)
    listed = set(re.findall(r'"([\w.]+)"', re.search(r"^packages = \[(.*?)\]", section, re.M | re.S).group(1)))
    assert {"clusterctl", "clusterctl.templates"} <= listed
    packages = {os.path.relpath(d, os.path.dirname(PACKAGE)).replace(os.sep, ".")
                for d, _, files in os.walk(PACKAGE) if "__init__.py" in files}
    assert packages - listed == set()


# ---- the trainer knows strategies by their registry entry (train/strategies.py), not by name --------------

def strategy_names() -> tuple[str, ...]:
    from clusterctl.train.strategies import names
    return names()


STRATEGY_NAMES = strategy_names()        # the registry's, in --strategy auto's order


def compared_strategies(path: str) -> list[tuple[int, str]]:
    """(line, source) of every comparison (==, !=, in, not in) with a strategy's name written out, alone or in a
    tuple, list or set, and of every dict keyed by one: a branch on a strategy's name."""
    def names_one(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in STRATEGY_NAMES
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(map(names_one, node.elts))

    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Compare) and any(map(names_one, [node.left, *node.comparators])):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Dict) and any(k is not None and names_one(k) for k in node.keys):
            found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_nothing_but_the_strategy_registry_branches_on_a_strategys_name():
    assert len(STRATEGY_NAMES) >= 3 and "zero3" in STRATEGY_NAMES        # the registry was read, not an empty one
    for module, path in ALL:
        if module != "clusterctl.train.strategies":
            assert compared_strategies(path) == [], module


def test_the_strategy_check_catches_a_branch_on_a_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(config, s):\n    if config.strategy == 'fsdp':\n        return 1\n"
                   "    if s in ('zero3', 'auto'):\n        return 2\n"
                   "    if s == 'auto' or config.balance == 'off':\n        return 3\n"      # not a strategy's name
                   "    return {'dp': 1}[s]\n")
    assert [line for line, _ in compared_strategies(str(bad))] == [2, 4, 8]


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module of an import graph (Tarjan's, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = counter[0]
                    counter[0] += 1
                    stack.append(step)
                    on.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(group)
    return found


def test_no_import_circle():
    """No module of clusterctl/ reaches itself through its imports, at the top or inside a function: transfer/'s
    models <-> relay went with storepush.py, train/'s with checkpoint formats in their strategy's entry
    (zero3_checkpoint.py), the checkpoint directories in stepdirs.py, the adapters' counters in adaptercount.py."""
    names = {m for m, _ in ALL}
    graph = {m: {t for t, _ in imports(m, path) if t in names and t != m} for m, path in ALL}
    assert circles(graph) == []
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]     # the check finds one
