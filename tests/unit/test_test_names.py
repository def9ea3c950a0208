"""pytest imports test modules by their base name (rootdir-relative, no packages): two tests/*/test_X.py
stop the whole run at collection. Caught here, where a run of tests/unit alone sees it too."""
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_name_of_its_own():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, count in names.items() if count > 1] == []
