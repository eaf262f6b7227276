"""The n-gram head a fit's export would choose, for a run trained before the head existed.

    python benchmarks/head_reading.py runs/suite/20ng-full-word2vec [runs/suite/20ng-full-glove ...]
    python benchmarks/head_reading.py runs/suite/* --buckets 0 1048576   # the vocabulary, then hashed

For each run: its data as the fit read it (the run's saved Lightning config), its exported HAN, the
baseline retrained on the same training split, the head chosen by the export's own code on validation
(training.export.ExportModel), and the test split read once: the model with the head (if kept), the
HAN alone and the baseline. The HAN's training is the same with or without the head (the head is
chosen after it), so this is what a fit of today's code reports for that trained HAN: a cheaper
check than retraining (20 Newsgroups in full: an hour a fit on one core). With ``--buckets`` it reads
each run once per head kind (0: the vocabulary; N: ``--export.ngram_buckets N``), on the same HAN, and
prints each head's size: the comparison that decides the default head.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def reading(run: Path, buckets: int | None = None) -> dict:
    from han import Pipeline, SavedModel
    from training.baseline import run_baseline
    from training.data import HANDataModule
    from training.export import ExportModel, _split
    from training.report import evaluate, headline

    config = yaml.safe_load(next(run.glob("csv/version_*/config.yaml")).read_text())
    data = HANDataModule(**config["data"])
    data.setup()
    saved = SavedModel.load(run / "model")
    assert saved.labels == list(data.label_names), "the run's labels differ from its data's"
    kind = {} if buckets is None else {"ngram_buckets": buckets}
    baseline, fitted = run_baseline(data, ["test"], None, buckets)
    ExportModel(register=False, **kind)._choose_head(saved, data, fitted)
    test = headline(evaluate(Pipeline(saved, batch_size=256), *_split(data, "test")))
    key = "micro_f1" if "micro_f1" in test else "accuracy"
    return {"run": run.name, "metric": key, "han_share": (saved.metadata.get("ngram_head") or {}).get("han_share"),
            "test": test[key], "han_alone_test": test.get(f"han_alone_{key}", test[key]),
            "baseline_test": baseline["test"][key], "buckets": buckets,
            "head_megabytes": (saved.metadata.get("ngram_head") or {}).get("megabytes"),
            "validation": saved.metadata.get("ngram_head")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--buckets", nargs="+", type=int, help="head kinds to read: 0 the vocabulary, N hashed buckets "
                        "(default: the recipe's for the run's size)")
    args = parser.parse_args()
    for run in args.runs:
        for buckets in args.buckets or [None]:
            print(json.dumps(reading(run, buckets)), flush=True)


if __name__ == "__main__":
    main()
