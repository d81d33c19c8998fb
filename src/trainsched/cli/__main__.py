"""``python -m trainsched.cli ...``: the command line, as the ``trainsched`` script runs it."""

import sys

from trainsched.cli import main

if __name__ == "__main__":
    sys.exit(main())
