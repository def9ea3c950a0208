"""`run --env`'s words as the ranks' environment (pure): NAME=VALUE, or NAME for this machine's value.

    parse_env_options(["A=1", "HF_TOKEN"], os.environ)     # (("A", "1"), ("HF_TOKEN", "<this machine's>"))
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

from ..errors import UsageError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env_options(given: Sequence[str], here: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """run --env's words, NAME=VALUE or NAME (this machine's value, from `here`), as (name, value) pairs, the
    last of a name winning (pure). A name that is not a variable name, or a bare NAME not set here, is refused in
    one line: a variable a user meant to send must not silently not arrive."""
    out: dict[str, str] = {}
    for word in given:
        name, eq, value = word.partition("=")
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"--env {word}: {name!r} is not a variable name (letters, digits and _, not starting "
                             "with a digit); write --env NAME=VALUE, or --env NAME for this machine's value")
        if not eq:
            if name not in here:
                raise UsageError(f"--env {name}: {name} is not set on this machine; give its value (--env "
                                 f"{name}=VALUE) or set it here first")
            value = here[name]
        out[name] = value
    return tuple(out.items())
