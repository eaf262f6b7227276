"""Explanation methods side by side on a trained model: what each costs, and how faithful it is.

    .venv/bin/python benchmarks/explain.py                         # han-imdb:latest, IMDB test
    .venv/bin/python benchmarks/explain.py runs/imdb/model --documents 500 --tau-documents 50

Cost: milliseconds per document through ``han.Pipeline`` with a full explanation, one review at a
time (the median over ``--single`` reviews: a service request) and in batches of 64 (han-score),
one torch thread, against no explanation. Faithfulness: ``han.faithfulness`` on ``--documents``
test reviews (comprehensiveness and sufficiency AOPC, top-1 sentence deletion, Kendall tau
against leave-one-word-out), each method against a random ranking.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from explained_reviews import add_model_arguments, pipeline_and_reviews


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--single", type=int, default=100, help="reviews explained one at a time")
    parser.add_argument("--batched", type=int, default=256, help="reviews explained in batches of 64")
    parser.add_argument("--documents", type=int, default=500, help="reviews for the faithfulness measures")
    parser.add_argument("--tau-documents", type=int, default=50, help="of those, for the Kendall tau")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    pipeline, texts = pipeline_and_reviews(parser, args)
    from han.faithfulness import evaluate_faithfulness
    from han.methods import METHODS

    print(f"model {args.model}; {os.cpu_count()} CPUs, 1 torch thread; load average {os.getloadavg()}", flush=True)

    cost: dict[str, dict[str, float]] = {}
    for method in ("none", *METHODS):
        explain = None if method == "none" else method
        pipeline(texts[:4], explain=explain)  # warm-up
        single = []
        for text in texts[: args.single]:
            start = time.perf_counter()
            pipeline([text], explain=explain)
            single.append(1000 * (time.perf_counter() - start))
        start = time.perf_counter()
        pipeline(texts[: args.batched], explain=explain)
        batched = 1000 * (time.perf_counter() - start) / args.batched
        cost[method] = {"single_p50_ms": statistics.median(single), "batched_ms_per_doc": batched}
        print(
            f"{method:<22} one review p50 {cost[method]['single_p50_ms']:7.1f} ms   batched {batched:7.2f} ms/review",
            flush=True,
        )

    print(f"\nfaithfulness on {args.documents} reviews (Kendall tau on {args.tau_documents}) ...", flush=True)
    faith = evaluate_faithfulness(pipeline, texts[: args.documents], tau_documents=args.tau_documents)
    random_ = faith["methods"]["random"]
    print(
        f"{'method':<22}{'comp. AOPC':>11}{'x random':>9}{'suff. AOPC':>11}{'x random':>9}"
        f"{'top-1 drop':>11}{'x random':>9}{'flip':>7}{'tau':>7}"
    )
    for method, m in faith["methods"].items():
        tau = faith["kendall_tau"].get(method)
        print(
            f"{method:<22}{m['comprehensiveness_aopc']:>11.4f}"
            f"{m['comprehensiveness_aopc'] / random_['comprehensiveness_aopc']:>9.1f}"
            f"{m['sufficiency_aopc']:>11.4f}{m['sufficiency_aopc'] / random_['sufficiency_aopc']:>9.2f}"
            f"{m['top1_sentence_drop']:>11.4f}{m['top1_sentence_drop'] / random_['top1_sentence_drop']:>9.1f}"
            f"{m['top1_sentence_flip_rate']:>7.3f}{'' if tau is None else f'{tau:7.3f}'}"
        )
    keys = ("comprehensiveness_aopc", "sufficiency_aopc", "top1_sentence_drop")
    print("\nx random, with 95% bootstrap intervals over the reviews")
    print(f"{'method':<22}" + "".join(f"{k:>26}" for k in keys))
    for method, m in faith["methods"].items():
        if "x_random" in m:
            print(f"{method:<22}" + "".join(f"{_interval(m['x_random'][k]):>26}" for k in keys))
    counts = faith["sentences_per_document"]
    print(
        f"sentences per review: mean {counts['mean']:.2f}, harmonic mean {counts['harmonic_mean']:.2f} "
        "(the top-1 ratio's scale: a random one of n sentences is the top one with probability 1/n)"
    )
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps({"cost": cost, "faithfulness": faith}, indent=2))
    return 0


def _interval(ratio: dict) -> str:
    if ratio["ratio"] is None:
        return "-"
    interval = "" if ratio["interval"] is None else " [{:.2f}, {:.2f}]".format(*ratio["interval"])
    return f"{ratio['ratio']:.2f}{interval}"


if __name__ == "__main__":
    sys.exit(main())
