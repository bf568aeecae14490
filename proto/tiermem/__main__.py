"""``python -m tiermem``: the administration commands, as the ``tiermem`` script runs them
(``tiermem.server.cli``)."""

import sys

from tiermem.server.cli import main

if __name__ == "__main__":
    sys.exit(main())
