"""``python -m scoring`` is ``han-score``."""

import sys

from scoring.cli import main

if __name__ == "__main__":
    sys.exit(main())
