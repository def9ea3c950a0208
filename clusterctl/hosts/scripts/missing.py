"""Which of the modules named in argv this python cannot import (detach/supervisor.py: what the supervisor needs
on its host): `python -c PROGRAM NAME...`, one JSON line, the list of those missing. Standard library only."""
import importlib.util
import sys

from .contract import reply

if __name__ == "__main__":
    reply([n for n in sys.argv[1:] if importlib.util.find_spec(n) is None])
