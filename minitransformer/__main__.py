"""``python -m minitransformer``: the command line of chapter 15 (:mod:`minitransformer.cli`)."""

import sys

from minitransformer.cli import main

if __name__ == "__main__":
    sys.exit(main())
