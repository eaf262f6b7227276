"""``python -m scoring`` is ``han-score``."""

from scoring.cli import command

if __name__ == "__main__":
    command()
