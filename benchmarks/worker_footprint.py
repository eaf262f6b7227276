"""What a serving worker holds, step by step: each import, the model, and the caches a stream of requests fills.

    python benchmarks/worker_footprint.py han-imdb:latest --requests 1000

One process does what a worker does, in its order (spaCy, BentoML, the service's modules, the model
through the one inference path, the worker's process settings), then classifies IMDB test reviews one at
a time with explanations, and prints its RSS and anonymous memory (``/proc/self/smaps_rollup``) after
each step. A worker imports no torch (``han.numpy_forward``; the gradient-based explanations run in a
helper process, ``service/gradients.py``): the last line says whether anything did. A served worker
adds BentoML's runtime (its server, middleware and metrics) on top;
``benchmarks/worker_memory.py`` measures that whole worker under load.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = REPO.parent / "shared" / "datasets" / "imdb" / "test.parquet"


def reading(step: str) -> None:
    """This process's RSS and anonymous memory (``smaps_rollup``'s kB are KiB), in MiB."""
    fields = {}
    with open(f"/proc/{os.getpid()}/smaps_rollup") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = int(value.split()[0]) if value.split() else 0
    rss, anon = fields["Rss"] >> 10, fields["Anonymous"] >> 10
    print(f"{step:40s} RSS {rss:5,d} MiB   anonymous {anon:5,d} MiB   files {rss - anon:5,d} MiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="BentoML tag or model directory")
    parser.add_argument("--requests", type=int, default=1000, help="one-review requests after the load")
    args = parser.parse_args()
    texts = _texts(args.requests)  # read first, in a child process: pyarrow stays out of this one
    reading("start")
    import han.segment  # noqa: F401  (spaCy, as a worker imports it: torch left out)

    reading("import spacy")
    import bentoml  # noqa: F401

    reading("import bentoml")
    # what service.service imports (an entry point: benchmarks start it as a process, never import it)
    import monitoring.shadow  # noqa: F401
    import service.api
    import service.batcher
    import service.feedback
    import service.models
    import service.monitor_page
    import service.pages
    import service.way_back  # noqa: F401

    reading("the service's modules")
    from han.environment import freeze_loaded_objects, release_free_memory, tune_process
    from han.pipeline import Pipeline
    from model_store import open_model

    tune_process(1)
    pipeline = Pipeline(open_model(args.model)[1])
    freeze_loaded_objects()
    release_free_memory()
    reading("the model loaded")
    head = pipeline.saved.ngrams
    weights = sum(w.nbytes for w in pipeline.saved.weights.values())
    print(f"  weights {weights / 2**20:.1f} MiB, n-gram head {head.nbytes / 2**20 if head else 0:.1f} MiB, "
          f"vocabulary {len(pipeline.saved.vocab.stoi):,} words")
    for text in texts:
        pipeline([text], explain=True)
    release_free_memory()
    reading(f"{len(texts):,} requests, trimmed")
    pipeline.release_caches()
    release_free_memory()
    reading("its caches released, trimmed")
    print(f"torch imported: {'torch' in sys.modules}")


def _texts(n: int) -> list[str]:
    import json
    import subprocess

    code = ("import json, sys, pyarrow.parquet as pq; "
            f"print(json.dumps(pq.read_table(sys.argv[1], columns=['text']).column('text').to_pylist()[:{n}]))")
    return json.loads(subprocess.run([sys.executable, "-c", code, str(DATA)], capture_output=True, text=True,
                                     check=True).stdout)


if __name__ == "__main__":
    main()
