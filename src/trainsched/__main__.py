"""``python -m trainsched ...`` (and ``torchrun -m trainsched ...``): the command line."""

import sys

from trainsched.cli import main

if __name__ == "__main__":
    sys.exit(main())
