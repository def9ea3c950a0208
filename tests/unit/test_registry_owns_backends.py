"""No backend name is compared outside the registry (clusterctl/launch/backends/): whatever differs between
backends is a capability of its entry, so a backend registered the documented way is treated by what it can
do. Naming a backend as a default (`DEFAULT_BACKEND = "ring"`, a CLI option's default) is fine; comparing
with one, looking one up by it or keying a table by it is not."""
import ast
import dataclasses
import pathlib

import clusterctl
from clusterctl.launch.backends import REGISTRY, Backend

PACKAGE = pathlib.Path(clusterctl.__file__).parent
REGISTRY_PACKAGE = "launch/backends/"

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
        if not path.startswith(REGISTRY_PACKAGE):
            found += name_comparisons(file.read_text(), path, set(REGISTRY))
    assert found == [], "ask the backend (a capability on launch/backends/'s Backend) instead:\n" + "\n".join(found)


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


# ---- the registry's own shape (issue 39): a package, one module per launcher family, shared records ----------

def _entries():
    """Every registered entry and every fallback launcher of one."""
    return [v for b in REGISTRY.values() for v in (b, *b.fallbacks.values())]


def _backend_classes(path: pathlib.Path) -> list[str]:
    """The classes a module of the package defines that derive from Backend (directly, or through one of
    the package's own: read from the source, so a second family in one module is seen)."""
    tree = ast.parse(path.read_text())
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)
            and any(getattr(base, "id", None) in ("Backend", *(c.__name__ for c in _families())) for base in node.bases)]


def _families():
    return {type(e) for e in _entries()}


def test_the_backends_are_a_package_with_one_module_per_launcher_family():
    package = PACKAGE / REGISTRY_PACKAGE
    assert (package / "__init__.py").is_file()
    families = _families()
    modules = {cls.__module__ for cls in families}
    assert len(modules) == len(families) == 3, modules          # mpirun, mlx.launch, clusterctl's rank starter
    assert all(m.startswith("clusterctl.launch.backends.") for m in modules), modules
    defined = {path.name: _backend_classes(path) for path in package.glob("*.py")}
    assert all(len(classes) <= 1 for classes in defined.values()), defined     # never two families in one
    assert {c for classes in defined.values() for c in classes} == {c.__name__ for c in families}
    assert {e.launcher_name for e in _entries()} == {"mpirun", "mlx.launch", "clusterctl"}


def test_an_entry_shares_its_spec_with_its_fallbacks_and_the_records_are_frozen():
    """The rank starter is the same MLX backend as its mlx.launch fallback: it holds the same spec (name,
    rdma, what bench tunes, doctor's smoke test), never copies of its fields."""
    for entry in REGISTRY.values():
        for fallback in entry.fallbacks.values():
            assert fallback.spec is entry.spec, entry.name
    records = {e.spec for e in _entries()} | {r for e in _entries() for r in (e.smoke, e.tuning) if r is not None}
    assert {type(r).__name__ for r in records} == {"BackendSpec", "SmokeTest", "Tuning"}
    assert all(dataclasses.is_dataclass(r) and type(r).__dataclass_params__.frozen for r in records)
    assert all(isinstance(e, Backend) for e in _entries())


def test_the_family_check_sees_two_families_in_one_module(tmp_path):
    two = tmp_path / "two.py"
    two.write_text("class A(Backend):\n    pass\n\n\nclass B(MLXLaunchBackend):\n    pass\n\n\nclass C:\n    pass\n")
    assert _backend_classes(two) == ["A", "B"]
