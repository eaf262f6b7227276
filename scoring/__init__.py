"""``han-score``: classify every row of a large file, streaming, sharded and resumable.

    cli.py          the command: the checks that run before any work, exit codes
    arguments.py    its arguments (standard library only)
    read.py         streaming Parquet, CSV or JSON Lines input
    score.py        the one scoring function: a window of texts in, output columns out (han.Pipeline)
    workers.py      the scoring processes (concurrent.futures)
    job.py          one run: windows out to the scorers, results back in input order, chunks committed
    formats.py      the output columns and the Parquet, JSON Lines and CSV writers
    partial.py      atomic chunk commits, the manifest, --resume, the final merge
    progress.py     the progress bar and the summary
    ray_engine.py   --engine ray: Ray Data reads, an actor pool calling score.score_batch, part-file output
    ray_output.py   --engine ray's output folders: written beside OUTPUT, renamed into place when done
    read_causes.py  the row a failed Ray Data read of JSON Lines or CSV stopped at
    environment.py  the environment variables han-score sets for the processes it starts
    __main__.py     ``python -m scoring``

Imports han and model_store; never the service or the training code.
"""


class BatchError(Exception):
    """Stops the job with a one-line message, from either engine; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class Interrupted(Exception):
    """Ctrl-C or SIGTERM after a run began writing: the message says what it leaves behind."""
