"""Templates shipped with clusterctl: templates/ in the source tree, clusterctl/templates in the wheel."""
from __future__ import annotations

import string
from importlib import resources

PACKAGE = "clusterctl.templates"


def template_names() -> list[str]:
    return sorted(p.name for p in resources.files(PACKAGE).iterdir()
                  if p.is_file() and not p.name.endswith(".py"))


def template_text(name: str) -> str:
    """A template's text; `name` is a file name in templates/ (for example 'inventory.yaml.tmpl')."""
    if name not in template_names():
        raise FileNotFoundError(f"no template named {name!r}; have {', '.join(template_names())}")
    return resources.files(PACKAGE).joinpath(name).read_text(encoding="utf-8")


def render(text: str, **values: str) -> str:
    """Fill a template's $placeholders; a placeholder without a value is an error, not left in place."""
    return string.Template(text).substitute(values)
