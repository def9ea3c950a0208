"""`python -m clusterctl.train --help`: the bundled trainer (see trainer.py for launch commands)."""
import sys

from .trainer import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
