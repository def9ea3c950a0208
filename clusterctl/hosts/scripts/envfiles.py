"""The files MLX reads by path (MLX_HOSTFILE, MLX_IBV_DEVICES), written on the rank's host from
CLUSTERCTL_ENV_FILES (variable -> text, set by clusterctl's rank starter) into private temporary files.
Part of the rank bootstrap (bootstrap.py), and of doctor's smoke program (doctor/smoke.py)."""
from .contract import ENV_FILES_ENV


def env_files():
    """Write each file, point its variable at it; the paths, which the caller removes when the program is done."""
    import json
    import os
    import tempfile
    made = []
    for name, text in json.loads(os.environ.pop(ENV_FILES_ENV, "{}")).items():
        fd, path = tempfile.mkstemp(prefix="clusterctl-%s-" % name.lower())
        made.append(path)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.environ[name] = path
    return made
