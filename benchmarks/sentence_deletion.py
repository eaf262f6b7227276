"""Top-1 sentence deletion by the number of sentences in a document: why the ratio is what it is.

    .venv/bin/python benchmarks/sentence_deletion.py han-imdb:latest                  # 5,000 IMDB test reviews
    .venv/bin/python benchmarks/sentence_deletion.py runs/imdb/model --documents 0    # all 25,000 (20 minutes)

For each document, the drop in the predicted label's calibrated probability when each sentence
alone is removed (``han.faithfulness.sentence_drops``, the probability every faithfulness measure
uses). Its largest is the most any ranking's top sentence can drop, its mean the expected drop of a
random sentence, and the ratio of their means over documents the best top-1 "x random" figure of
``han.faithfulness`` on this model (which averages 20 random draws where a document has more than 20
sentences; this uses every sentence). Printed beside it: the ratio if no sentence but the top one
moved the probability, sum(top) / sum(top / n); the harmonic mean of the sentence counts n (that
figure when every document's top drop is the same); and the figures by sentence count, with the
predicted label's mean probability (is the model surer of longer documents?). Documents without
words are left out and counted.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

import numpy as np

from han.environment import apply_defaults

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "datasets" / "imdb" / "test.parquet"
BUCKETS = ((1, 3), (3, 5), (5, 8), (8, 12), (12, 20), (20, 10_000))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="han-imdb:latest", help="BentoML tag or model directory")
    parser.add_argument("--data", type=Path, default=DATA, help="a Parquet file (default: IMDB's test split)")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--documents", type=int, default=5000, help="reviews, after a seeded shuffle (0: all)")
    args = parser.parse_args()
    if args.documents < 0:
        parser.error("--documents must be 0 (all) or more")
    apply_defaults()
    import pyarrow.parquet as pq
    import torch

    import model_store
    from han import Pipeline
    from han.faithfulness import sentence_drops
    from han.pipeline import document_problem

    torch.set_num_threads(1)
    try:
        pipeline = Pipeline(model_store.load(args.model), batch_size=64)
    except model_store.ModelNotFoundError as error:
        parser.error(str(error))
    texts = pq.read_table(args.data, columns=[args.text_column]).column(args.text_column).to_pylist()
    random.Random(0).shuffle(texts)
    texts = [t for t in texts[: args.documents or None] if document_problem(t) is None]
    print(f"model {args.model}; {len(texts)} documents; load average {os.getloadavg()}", flush=True)

    every, probabilities = [], []
    for start in range(0, len(texts), 1000):
        drops_, p = sentence_drops(pipeline, texts[start : start + 1000])
        every += drops_
        probabilities += p.tolist()
    words = [i for i, d in enumerate(every) if len(d)]
    if len(words) < len(every):
        print(f"{len(every) - len(words)} documents without words left out")
    drops = [every[i] for i in words]
    confidence = np.array(probabilities)[words]
    n = np.array([len(d) for d in drops])
    top = np.array([d.max() for d in drops])
    mean = np.array([d.mean() for d in drops])
    print(
        f"top-1 sentence drop {top.mean():.4f}, random sentence {mean.mean():.4f}: {top.sum() / mean.sum():.2f}x\n"
        f"if no other sentence moved p: {top.sum() / (top / n).sum():.2f}x; "
        f"sentences per document: mean {n.mean():.2f}, harmonic mean {1 / np.mean(1 / n):.2f}"
    )
    print(f"{'sentences':>10}{'share':>8}{'top drop':>10}{'random':>9}{'x random':>10}{'mean p':>8}{'p > 0.99':>10}")
    for low, high in BUCKETS:
        inside = (n >= low) & (n < high)
        if inside.any():
            label = f"{low}-{high - 1}" if high < 10_000 else f"{low}+"
            print(
                f"{label:>10}{inside.mean():>8.2f}{top[inside].mean():>10.4f}{mean[inside].mean():>9.4f}"
                f"{top[inside].sum() / mean[inside].sum():>10.2f}{confidence[inside].mean():>8.3f}"
                f"{(confidence[inside] > 0.99).mean():>10.2f}"
            )
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
