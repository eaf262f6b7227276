"""``han-train``'s entry point. Ctrl-C while torch and Lightning import (the first seconds) is held until
the imports end, then stops with one line and status 130: raised inside an import, it either printed a
traceback or was swallowed by a library's own try/except, and the fit went on."""

from __future__ import annotations

import signal
import sys

_interrupted: list[int] = []


def _hold(signum: int, frame: object) -> None:
    _interrupted.append(signum)


def main() -> None:
    signal.signal(signal.SIGINT, _hold)
    try:
        from training.cli import main as run
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _interrupted:
        print("han-train: interrupted", file=sys.stderr)
        sys.exit(130)
    run()


if __name__ == "__main__":
    main()
