"""How far the monitor's accuracy estimate is from the realised accuracy, and whether it flags shift.

Classifies each stream with the model as the service does (han.Pipeline, with the profiles the log
keeps), builds the records the inference log holds, and runs the monitor's own report on them
(``monitoring.report``), with every document's true label as feedback where the stream's labels are
the model's. Prints, per stream: the estimate, the realised accuracy with its interval, the error,
and the shift tests.

    python benchmarks/monitor_estimate.py runs/imdb_quick/model \\
        --stream ../shared/datasets/imdb/test.parquet \\
        --stream ../shared/datasets/imdb/test.parquet --first-sentences 1 \\
        --stream ../shared/datasets/20newsgroups/test.parquet

``--first-sentences N`` keeps each document's first N sentences of the ``--stream`` it follows (a stream of
short texts, from the same corpus: labelled, and shifted in length): above, the second stream only.
Streams are seeded samples of ``--limit`` documents.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from han.environment import apply_defaults  # noqa: E402


class _ForLastStream(argparse.Action):
    """``--first-sentences N``: for the ``--stream`` just before it (argparse acts on the options in the
    order given), kept as a list by stream position, 0 (all sentences) for the streams without one."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        streams = getattr(namespace, "stream", None) or []
        if not streams:
            parser.error(f"{option_string} applies to the --stream before it: give that --stream first")
        firsts = list(getattr(namespace, self.dest) or [])
        firsts += [0] * (len(streams) - len(firsts))
        firsts[len(streams) - 1] = values
        setattr(namespace, self.dest, firsts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a model directory or a tag of the model store")
    parser.add_argument("--stream", action="append", required=True, help="a Parquet file with text (and label)")
    parser.add_argument("--first-sentences", type=int, action=_ForLastStream, default=None, metavar="N",
                        help="for the --stream just before it: keep the first N sentences (0: all)")
    parser.add_argument("--limit", type=int, default=5000, help="documents per stream (default 5000)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def stream(path: str, limit: int, seed: int, first: int, segmenter) -> tuple[list[str], list[list[str]] | None]:
    import pandas as pd

    frame = pd.read_parquet(path)
    frame = frame.sample(min(limit, len(frame)), random_state=seed).reset_index(drop=True)
    texts = frame["text"].astype(str).tolist()
    if first:  # up to the end of the first N sentences, as the segmenter splits them
        spans = [segmenter.segment(t).sentence_spans for t in texts]
        texts = [t[: s[min(first, len(s)) - 1][1]] if s else t for t, s in zip(texts, spans, strict=True)]
    if "label" in frame:
        return texts, [[str(x)] for x in frame["label"]]
    if "labels" in frame:
        return texts, [[str(x) for x in labels] for labels in frame["labels"]]
    return texts, None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    apply_defaults()
    import torch

    from han import Pipeline
    from model_store import load
    from monitoring.report import version_report

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    saved = load(args.model)
    pipeline = Pipeline(saved)
    multi = bool(saved.config.multi_label)
    print(f"model {args.model}: labels {', '.join(saved.labels)}; profile: "
          f"{'yes' if saved.profile else 'no (estimate from the calibrated scores, no shift tests)'}")
    print(f"load average {os.getloadavg()}\n")
    firsts = (args.first_sentences or []) + [0] * len(args.stream)
    for path, first in zip(args.stream, firsts, strict=False):
        started = time.monotonic()
        texts, truth = stream(path, args.limit, args.seed, first, pipeline.segmenter)
        profiles: list[tuple[int, int]] = []
        results = pipeline(texts, errors="return", profiles=profiles)
        records, feedback = [], {}
        for k, r in enumerate(results):
            if hasattr(r, "reason"):
                continue
            words, unknown = profiles[k]
            records.append({"id": str(k), "request_id": "stream", "time": "", "label": r.label, "labels": r.labels,
                            "scores": r.scores, "words": words, "oov": unknown / words if words else 0.0})
            if truth is not None and set(truth[k]) <= set(saved.labels):
                feedback[str(k), "stream"] = truth[k]  # (id, request): the answer the feedback judges
        figures = version_report(records, feedback, saved.profile, saved.labels, multi)
        name = Path(path).parent.name + "/" + Path(path).name + (f", first {first} sentence(s)" if first else "")
        fb, shift = figures["feedback"], figures["shift"]
        print(f"{name}: {figures['documents']:,} documents ({time.monotonic() - started:.0f} s)")
        print(f"  estimated accuracy {figures['estimated_accuracy']:.4f} (from the {figures['estimate_from']})")
        if fb["documents"]:
            print(f"  realised accuracy {fb['accuracy']:.4f} [{fb['interval'][0]:.4f}, {fb['interval'][1]:.4f}] on "
                  f"{fb['documents']:,}; error of the estimate {fb['estimated_on_them'] - fb['accuracy']:+.4f}")
        else:
            print("  realised accuracy: the stream's labels are not the model's (no feedback possible)")
        for key in ("words", "oov", "predicted"):
            test = shift[key]
            if test and "median" in test:
                size, medians = f"KS {test['statistic']:.3f}", f", median {test['median']:g} against " \
                    f"{test['reference_median']:g}"
            elif test:
                size, medians = f"distance {test['distance']:.3f}", ""
            if test:
                print(f"  shift {key}: {size}, p {test['p_value']:.3g}{medians}{' FLAGGED' if test['flagged'] else ''}")
        print(f"  shift flagged: {shift['flagged']}\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
