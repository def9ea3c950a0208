"""A model named as the Hugging Face hub names it (`mlx-community/Qwen3-4B-4bit`, or `ORG/NAME@REVISION`),
resolved on this machine to a snapshot directory of the hub's own cache, which the model store then pushes to
the hosts as any model directory (transfer/localmodel.py reads a snapshot's links into its blobs).

    path = resolve("mlx-community/Qwen3-4B-4bit")    # ~/.cache/huggingface/hub/models--mlx-community--…/snapshots/REV
    path = resolve("models/mine")                     # a directory here: returned as it is (checked by its users)

Through `huggingface_hub` (the `hub` extra; mlx-lm brings it too), with its cache layout and variables as the
ecosystem uses them (HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN): a model in the cache is used as it is;
otherwise it is downloaded here once, with the hub client's own progress bars, only the files mlx-lm loads. With
HF_HUB_OFFLINE set (or no network) a model not in the cache is one line naming the cache looked in. The hosts
never need the hub or a token: they get the files from the store.

A word is taken as a hub id only when it is not a path here and has the id's shape (ORG/NAME, one slash, the
hub's characters); anything else is left to the caller as a directory.
"""
from __future__ import annotations

import os
import re

from ..errors import ModelError

HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95})"
                    r"(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9._/-]{0,199}))?")
# what mlx-lm itself downloads of a model (mlx_lm.utils): its config, weights, tokenizer and code
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "tiktoken.model", "*.txt",
                  "*.jsonl", "*.jinja"]


def hub_id(word: str, base: str | None = None) -> tuple[str, str | None] | None:
    """(repo, revision or None) when `word` names a hub model rather than a path here (relative to `base`, else
    the current directory); None otherwise."""
    m = HUB_ID.fullmatch(word)
    if m is None or os.path.exists(os.path.join(base or os.curdir, os.path.expanduser(word))) or ".." in m.group("repo"):
        return None
    return m.group("repo"), m.group("revision")


def resolve(word: str, base: str | None = None) -> str:
    """`word` as a model directory here: a hub id's snapshot in the hub cache (downloaded into it first when it is
    not there and the hub may be reached), or `word` itself when it is not a hub id (a path, relative to `base`)."""
    named = hub_id(word, base)
    if named is None:
        return word
    repo, revision = named
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                            RevisionNotFoundError)
    except ImportError:
        raise ModelError(f"{word}: no such directory here; to name a Hugging Face model by its id, install the hub "
                         "client (pip install huggingface_hub)") from None
    cache = constants.HF_HUB_CACHE
    try:
        return snapshot_download(repo, revision=revision, local_files_only=True, allow_patterns=ALLOW_PATTERNS)
    except LocalEntryNotFoundError:
        pass
    if constants.HF_HUB_OFFLINE:
        raise ModelError(f"{word}: no such directory here, and not in the Hugging Face cache here ({cache}) while "
                         "HF_HUB_OFFLINE is set: unset it to download the model once, or give a model directory")
    try:
        return snapshot_download(repo, revision=revision, allow_patterns=ALLOW_PATTERNS)
    except GatedRepoError:
        raise ModelError(f"{word}: the hub keeps this model behind an access request: accept its terms on the hub, "
                         "then log in here (hf auth login or HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise ModelError(f"{word}: no such directory here, and the Hugging Face hub has no model of that id (or it "
                         "is private: log in with hf auth login or HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise ModelError(f"{word}: the hub's {repo} has no revision {revision!r}") from None
    except (LocalEntryNotFoundError, OSError) as e:      # no network: the hub client's own reason, its first line
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"{word}: no such directory here, not in the Hugging Face cache here ({cache}), and the "
                         f"hub could not be reached ({reason})") from None
