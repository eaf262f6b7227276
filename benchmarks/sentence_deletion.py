"""Top-1 sentence deletion by the number of sentences in a document: why the ratio is what it is.

    .venv/bin/python benchmarks/sentence_deletion.py han-imdb:latest                  # 5,000 IMDB test reviews
    .venv/bin/python benchmarks/sentence_deletion.py runs/imdb/model --documents 0    # all 25,000 (20 minutes)

For each document, the drop in the predicted label's calibrated probability when each sentence
alone is removed (``han.faithfulness.sentence_drops``, the probability every faithfulness measure
uses). Its largest is the most any ranking's top sentence can drop, its mean the expected drop of a
random sentence, and the ratio of their means over documents the best top-1 "x random" figure of
``han.faithfulness`` on this model (which averages 20 random draws where a document has more than 20
sentences; this uses every sentence), with its bootstrap interval. Printed beside it: the ratio if no
sentence but the top one moved the probability, sum(top) / sum(top / n); the harmonic mean of the
sentence counts n (that figure when every document's top drop is the same); and the figures by
sentence count, with the predicted label's mean probability (is the model surer of longer
documents?). Documents without words are left out and counted.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from explained_reviews import add_model_arguments, pipeline_and_reviews

BUCKETS = ((1, 3), (3, 5), (5, 8), (8, 12), (12, 20), (20, 10_000))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--documents", type=int, default=5000, help="reviews, after a seeded shuffle (0: all)")
    args = parser.parse_args()
    if args.documents < 0:
        parser.error("--documents must be 0 (all) or more")
    pipeline, texts = pipeline_and_reviews(parser, args)
    from han.faithfulness import ratio_interval, sentence_counts, sentence_drops
    from han.pipeline import document_problem

    texts = [t for t in texts[: args.documents or None] if document_problem(t) is None]
    print(f"model {args.model}; {len(texts)} documents; load average {os.getloadavg()}", flush=True)

    every, probabilities = [], []
    for start in range(0, len(texts), 1000):
        drops_, p = sentence_drops(pipeline, texts[start : start + 1000])
        every += drops_
        probabilities += p.tolist()
    kept = [i for i, d in enumerate(every) if len(d)]
    if len(kept) < len(every):
        print(f"{len(every) - len(kept)} documents without words left out")
    drops = [every[i] for i in kept]
    confidence = np.array(probabilities)[kept]
    n = np.array([len(d) for d in drops])
    counts = sentence_counts(n)
    top = np.array([d.max() for d in drops])
    mean = np.array([d.mean() for d in drops])
    ratio = ratio_interval(top, mean, np.random.default_rng(0))
    interval = "no interval" if ratio["interval"] is None else "{:.2f}-{:.2f}".format(*ratio["interval"])
    print(
        f"top-1 sentence drop {top.mean():.4f}, random sentence {mean.mean():.4f}: {top.sum() / mean.sum():.2f}x "
        f"({ratio['confidence']:.0%} bootstrap interval over documents: {interval})\n"
        f"if no other sentence moved p: {top.sum() / (top / n).sum():.2f}x; "
        f"sentences per document: mean {counts['mean']:.2f}, harmonic mean {counts['harmonic_mean']:.2f}"
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
