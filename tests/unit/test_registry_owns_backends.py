"""No backend name is compared outside the registry (clusterctl/launch/backends.py): whatever differs between
backends is a capability of its entry, so a backend registered the documented way is treated by what it can
do. Naming a backend as a default (`DEFAULT_BACKEND = "ring"`, a CLI option's default) is fine; comparing
with one, looking one up by it or keying a table by it is not."""
import ast
import pathlib

import clusterctl
from clusterctl.launch.backends import REGISTRY

PACKAGE = pathlib.Path(clusterctl.__file__).parent
REGISTRY_FILE = "launch/backends.py"

# The same words meaning something else, by (file, function, word)
NOT_BACKENDS = {
    ("inventory.py", "cluster", "mpi"): "the inventory's `mpi:` section",
    ("doctor/checks.py", "parity", "mpi"): "the Open MPI version parity compares across hosts",
}


def _name(node, names) -> str | None:
    return node.value if isinstance(node, ast.Constant) and node.value in names else None


def _named(node, names) -> list[str]:
    """The backend names `node` is, or holds as a literal tuple, list or set."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for n in (_name(e, names) for e in node.elts) if n]
    found = _name(node, names)
    return [found] if found else []


def _uses(node, names) -> list[tuple[str, str]]:
    """(how, name) for each way `node` itself compares with or looks up by a backend name."""
    if isinstance(node, ast.Compare):
        return [("compared", n) for side in (node.left, *node.comparators) for n in _named(side, names)]
    if isinstance(node, ast.Subscript):
        return [("looked up", n) for n in _named(node.slice, names)]
    if isinstance(node, ast.MatchValue):
        return [("matched", n) for n in _named(node.value, names)]
    if isinstance(node, ast.Dict):
        return [("a key", n) for key in node.keys if key is not None for n in _named(key, names)]
    if isinstance(node, ast.Call) and (getattr(node.func, "id", None) == "get" or getattr(node.func, "attr", None) == "get"):
        return [("looked up", n) for arg in node.args[:1] for n in _named(arg, names)]
    return []


def name_comparisons(source: str, path: str, names) -> list[str]:
    """`path:line: how 'name' (in function)` for every comparison or lookup by a backend name in `source`
    that NOT_BACKENDS does not excuse."""
    found = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        for how, name in _uses(node, names):
            if (path, function, name) not in NOT_BACKENDS:
                found.append(f"{path}:{node.lineno}: {how} {name!r} (in {function})")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), None)
    return found


def test_no_backend_name_is_compared_outside_the_registry():
    found = []
    for file in sorted(PACKAGE.rglob("*.py")):
        path = file.relative_to(PACKAGE).as_posix()
        if path != REGISTRY_FILE:
            found += name_comparisons(file.read_text(), path, set(REGISTRY))
    assert found == [], "ask the backend (a capability on launch/backends.py's Backend) instead:\n" + "\n".join(found)


def test_the_check_finds_every_kind_of_comparison_and_lets_defaults_be():
    caught = """
def f(backend, spec, table, b):
    if backend == "jaccl": pass
    if "ring" != b.name: pass
    if backend in ("ring", "mpi"): pass
    if backend not in {"jaccl"}: pass
    x = spec["mpi"]
    y = {"ring": 1}
    z = get("jaccl"), table.get("mpi")
    match backend:
        case "ring": pass
"""
    found = name_comparisons(caught, "x.py", {"mpi", "ring", "jaccl"})
    assert [line.split(":")[1] for line in found] == ["3", "4", "5", "5", "6", "7", "8", "9", "9", "11"]
    allowed = """
DEFAULT_BACKEND = "ring"
def f(backend="mpi", option=click.option("--backend", default="mpi")):
    return run(backend="jaccl"), "the ring backend" == backend
"""
    assert name_comparisons(allowed, "x.py", {"mpi", "ring", "jaccl"}) == []
    excused = "def parity(values):\n    return values['mpi']\n"
    assert name_comparisons(excused, "doctor/checks.py", {"mpi"}) == []
    assert name_comparisons(excused, "doctor/other.py", {"mpi"}) == ["doctor/other.py:2: looked up 'mpi' (in parity)"]
