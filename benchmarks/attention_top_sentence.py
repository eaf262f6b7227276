"""Attention's top sentence against a random one, on more reviews than a fit's own check reads.

    .venv/bin/python benchmarks/attention_top_sentence.py han-imdb:latest                  # 1,000 IMDB test reviews
    .venv/bin/python benchmarks/attention_top_sentence.py runs/quick/model --validation     # the fit's validation split

The drop in the predicted label's calibrated probability when attention's top sentence is removed,
against a random sentence's (``han.faithfulness``'s top-1 "x random", with its bootstrap interval),
beside the most any ranking's top sentence reaches on the same reviews (each sentence removed in
turn, as ``benchmarks/sentence_deletion.py``). ``--validation`` reads the validation split a fit on
IMDB's training file holds out (10%, stratified, seed 42: ``training.splits.stable_holdout``, as
``training.data`` carves it), for
choosing settings without the test split. The fit's own check uses 100 test reviews
(``imdb_quick.yaml``); its interval is wide, so settings are compared here.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import numpy as np
from explained_reviews import IMDB_TEST, add_model_arguments, pipeline_and_reviews

IMDB_TRAIN = IMDB_TEST.with_name("train.parquet")


def validation_reviews(seed: int = 42, share: float = 0.1) -> list[str]:
    """IMDB training reviews a fit holds out for validation (``data.seed`` and ``data.val_fraction`` at their
    defaults), shuffled with seed 0: ``training.splits.stable_holdout`` of the texts, stratified by the
    label as a string, the rule ``training.data`` carves the split with."""
    import pyarrow.parquet as pq

    from training.splits import stable_holdout

    table = pq.read_table(IMDB_TRAIN, columns=["text", "label"])
    texts, labels = table.column("text").to_pylist(), [str(x) for x in table.column("label").to_pylist()]
    _, held_out = stable_holdout(texts, labels, share, seed)
    reviews = [texts[i] for i in held_out]
    random.Random(0).shuffle(reviews)
    return reviews


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--documents", type=int, default=1000, help="reviews, after a seeded shuffle")
    parser.add_argument("--validation", action="store_true", help="IMDB's held-out validation reviews instead")
    args = parser.parse_args()
    if args.documents < 1:
        parser.error("--documents must be at least 1")
    if args.validation and (args.data != IMDB_TEST or args.text_column != "text"):
        parser.error("--validation reads IMDB's training file; it does not take --data or --text-column")
    pipeline, texts = pipeline_and_reviews(parser, args)
    if args.validation:
        texts = validation_reviews()
    from han.faithfulness import evaluate_faithfulness, ratio_interval, sentence_drops

    texts = texts[: args.documents]
    split = "validation" if args.validation else str(args.data)
    print(f"model {args.model}; {len(texts)} reviews of {split}; load average {os.getloadavg()}", flush=True)
    report = evaluate_faithfulness(pipeline, texts, methods=["attention"], tau_documents=0)
    attention = report["methods"]["attention"]["x_random"]["top1_sentence_drop"]
    drops = [d for d in sentence_drops(pipeline, texts)[0] if len(d)]
    best = ratio_interval(np.array([d.max() for d in drops]), np.array([d.mean() for d in drops]),
                          np.random.default_rng(0))

    def figure(ratio: dict) -> str:
        if ratio["ratio"] is None:
            return "no ratio (no random sentence moved the label)"
        low_high = "no interval" if ratio["interval"] is None else "{:.2f} to {:.2f}".format(*ratio["interval"])
        return f"{ratio['ratio']:.2f}x random ({ratio['confidence']:.0%} interval {low_high})"

    print(f"attention's top sentence: {figure(attention)}")
    print(f"the best any ranking reaches: {figure(best)}")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
