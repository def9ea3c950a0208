"""The launcher's side of the rank bootstrap, the program every rank runs before the user's script
(hosts/scripts/bootstrap.py and its pieces, sent as one text: rank_program in job.py puts it on the command line).
Every rank's bootstrap writes tagged lines, MARK + "<rank> <kind> <payload>", kind in
start | out | err | bar | world | hb | exit; parse_line reads them back."""
from ..hosts.scripts import program

MARK = "\x1eclusterctl "

BOOTSTRAP = program("bootstrap.py")         # what `python -c` runs on every rank, after a comment with the run id
ENV_FILES = program("envfiles.py")          # env_files(), which doctor's smoke program runs too (with contract.py)


def parse_line(line: str) -> tuple[int, str, str] | None:
    """(rank, kind, payload) for a tagged line, None for anything else (the launcher's own output).
    A pty (mlx.launch's ssh -tt) may put text or \\r before the mark: the mark is searched for (see
    docs/facts/launchers.md#mlx-launch-runs-ssh-tt)."""
    at = line.find(MARK)
    if at < 0:
        return None
    rank, _, rest = line[at + len(MARK):].rstrip("\r\n").partition(" ")
    kind, _, payload = rest.partition(" ")
    try:
        return int(rank), kind, payload
    except ValueError:
        return None
