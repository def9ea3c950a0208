"""Rooms with one job each (issue 55): no function in run/ or cli/ is longer than 60 lines, counted from its `def` to
its last line (a longer one does several things: give each its own function, named for what it does)."""
import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "..", "clusterctl")
LONGEST = 60
FOLDERS = ("run", "cli")


def long_functions(source: str, longest: int = LONGEST) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in `source` over `longest` lines, nested ones too."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > longest]


def modules(folder: str) -> list[str]:
    root = os.path.join(PACKAGE, folder)
    return sorted(os.path.join(root, name) for name in os.listdir(root) if name.endswith(".py"))


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_function_in_run_or_cli_is_over_60_lines(folder):
    paths = modules(folder)
    assert len(paths) >= 3, paths              # the folder was read, not an empty one
    found = {os.path.relpath(path, PACKAGE): long_functions(open(path, encoding="utf-8").read()) for path in paths}
    assert {path: functions for path, functions in found.items() if functions} == {}


def test_the_length_check_catches_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    bad = (f"def short():\n    return 1\n\n\ndef long(a):\n{body}    return a\n\n\n"
           f"class C:\n    @property\n    def method(self):\n{body.replace('    ', '        ')}        return 0\n")
    assert long_functions(bad) == [("long", 62), ("method", 62)]
    assert long_functions(bad, longest=62) == []
    nested = f"def outer():\n    def inner():\n{body.replace('    ', '        ')}        return 0\n    return inner\n"
    assert long_functions(nested) == [("outer", 64), ("inner", 62)]
