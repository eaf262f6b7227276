"""Accuracy on training documents a few-label suite setting leaves out: a validation set of thousands
where the fit's own is 100-200 documents, to choose settings on without reading test.

    python benchmarks/left_out.py imdb-1000 RUN/model [RUN/model ...] [--documents 3000]

The documents are a seeded stratified draw from the rest of the setting's training split (the text its
``*-unlabelled`` form gives as unlabelled), with their labels. Each model is read through the inference
pipeline: the model's accuracy and the HAN alone's (its n-gram head left out), beside the TF-IDF
baseline fitted as the fit fits it (the setting's training file less the fit's validation split).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import suite  # benchmarks/suite.py
from sklearn.model_selection import train_test_split

from han import Pipeline, SavedModel
from training.baseline import train_baseline
from training.splits import stable_holdout

SETTINGS = sorted({base for base, _ in suite.UNLABELLED.values()})  # the few-label ones: imdb-1000, ...
VAL_FRACTION, SEED = 0.1, 42  # the fit's validation split (training.data's defaults)


def left_out(setting: str, documents: int) -> tuple[list[str], list[str]]:
    """Texts and labels of ``documents`` training documents the setting's sample leaves out."""
    folder = suite.SETTINGS[setting][0]
    table = pq.read_table(suite.SHARED / folder / "train.parquet", columns=["text", "label"])
    labels = table.column("label").to_pylist()
    _, rest = suite.split_rows(table, int(setting.rsplit("-", 1)[1]), "label")  # the setting's sample, and the rest
    chosen, _ = train_test_split(rest, train_size=documents, random_state=1, stratify=[labels[i] for i in rest])
    kept = table.take(sorted(chosen))
    return kept.column("text").to_pylist(), [str(x) for x in kept.column("label").to_pylist()]


def baseline_accuracy(setting: str, texts: list[str], labels: list[str]) -> float:
    """The TF-IDF baseline fitted on the setting's training file less the fit's validation split."""
    train, _, _ = suite.setting_files(setting, suite.REPO / ".cache" / "suite-data")
    table = pq.read_table(train)
    raw = [str(x) for x in table.column("label").to_pylist()]
    names = sorted(set(raw))
    y = np.array([names.index(x) for x in raw])
    texts_train = table.column("text").to_pylist()
    fit, _ = stable_holdout(texts_train, raw, VAL_FRACTION, SEED)  # training.data's rule: the fit's own split
    model = train_baseline([texts_train[i] for i in fit], y[fit], False)
    return float((model.predict(texts) == np.array([names.index(x) for x in labels])).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("setting", choices=SETTINGS)
    parser.add_argument("models", nargs="+", type=Path, help="model directories (a run's model/)")
    parser.add_argument("--documents", type=int, default=3000)
    args = parser.parse_args()
    texts, labels = left_out(args.setting, args.documents)
    print(f"{args.setting}: {len(texts):,} left-out training documents; "
          f"baseline {baseline_accuracy(args.setting, texts, labels):.4f}")
    for directory in args.models:
        pipeline = Pipeline(SavedModel.load(directory), batch_size=128)
        results, logits = pipeline.with_logits(texts)
        truth = np.array([pipeline.labels.index(x) for x in labels])
        model = np.mean([pipeline.labels.index(r.label) for r in results] == truth)
        print(f"{directory}: model {model:.4f}, HAN alone {np.mean(logits.argmax(1) == truth):.4f}")


if __name__ == "__main__":
    main()
