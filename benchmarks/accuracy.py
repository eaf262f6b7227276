"""HAN against the TF-IDF baseline on the same train/test split, in one run.

    python benchmarks/accuracy.py                       # all four datasets (hours on 2 cores)
    python benchmarks/accuracy.py imdb 20newsgroups     # some of them
    python benchmarks/accuracy.py imdb --han-run runs/imdb   # reuse a finished `han-train fit` run
    python benchmarks/accuracy.py imdb 20newsgroups --labelled 2000   # few labels: 2,000 labelled + the rest unlabelled
    python benchmarks/accuracy.py imdb --han-args="--model.dropout 0.4"   # any han-train override
    python benchmarks/accuracy.py --suite --jobs 2      # the default recipe across settings (benchmarks/suite.py)

Baseline: TF-IDF uni+bigrams (sublinear tf, min_df=2) + LogisticRegression(C=10), or one-vs-rest
LinearSVC for multi-label Reuters. HAN: `han-train fit --config data/configs/<dataset>.yaml`.
With ``--labelled N`` both learn from a stratified sample of N training documents (seed 0), and the
HAN also gets the rest of the training split's text as ``--data.unlabeled`` (word vectors built
from it) and the small-data overlay ``data/configs/small_data.yaml``; the test split is the same.
Prints a table: dataset, model, score (accuracy; micro-F1 for Reuters), train time, and the HAN's
training throughput (documents/s, words/s, seconds per epoch) from its CSV log.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import datasets
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score
from sklearn.multiclass import OneVsRestClassifier
from sklearn.preprocessing import MultiLabelBinarizer
from sklearn.svm import LinearSVC

from han.environment import apply_defaults

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("HAN_SHARED_DATASETS", REPO.parent / "shared" / "datasets"))
DATASETS = {  # name: (folder, label column, multi-label, config)
    "imdb": ("imdb", "label", False, "imdb"),
    "imdb_rating": ("imdb", "rating", False, "imdb_rating"),
    "20newsgroups": ("20newsgroups", "label", False, "20newsgroups"),
    "reuters": ("reuters21578", "labels", True, "reuters"),
}



def load(folder: str, split: str) -> datasets.Dataset:
    return datasets.load_dataset("parquet", data_files=str(SHARED / folder / f"{split}.parquet"), split="train")


def few_labels(name: str, labelled: int, workdir: Path) -> tuple[Path, Path]:
    """A stratified sample of ``labelled`` training documents, and the rest of the training text."""
    from sklearn.model_selection import train_test_split

    folder, column, multi, _ = DATASETS[name]
    train = load(folder, "train")
    stratify = None if multi else [str(y) for y in train[column]]
    keep, rest = train_test_split(range(len(train)), train_size=labelled, random_state=0, stratify=stratify)
    sample, unlabeled = workdir / f"{name}-{labelled}.parquet", workdir / f"{name}-unlabeled.parquet"
    train.select(sorted(keep)).to_parquet(str(sample))
    train.select(sorted(rest)).select_columns(["text"]).to_parquet(str(unlabeled))
    return sample, unlabeled


def baseline(name: str, train_path: Path | None = None) -> dict:
    folder, column, multi, _ = DATASETS[name]
    train, test = load(folder, "train"), load(folder, "test")
    if train_path is not None:
        train = datasets.load_dataset("parquet", data_files=str(train_path), split="train")
    start = time.perf_counter()
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2)
    x_train = vectorizer.fit_transform(train["text"])
    if multi:
        binarizer = MultiLabelBinarizer()
        y_train = binarizer.fit_transform(train[column])
        model = OneVsRestClassifier(LinearSVC(C=1.0)).fit(x_train, y_train)
    else:
        y_train = [str(y) for y in train[column]]
        model = LogisticRegression(C=10, max_iter=2000).fit(x_train, y_train)
    seconds = time.perf_counter() - start
    predicted = model.predict(vectorizer.transform(test["text"]))
    if multi:
        truth = binarizer.transform(test[column])
        score, metric = f1_score(truth, predicted, average="micro"), "micro-F1"
    else:
        score, metric = accuracy_score([str(y) for y in test[column]], predicted), "accuracy"
    model_name = "TF-IDF 1-2gram + OvR LinearSVC" if multi else "TF-IDF 1-2gram + LogReg(C=10)"
    return {"dataset": name, "model": model_name, "metric": metric, "score": score, "train_s": seconds}


def han(name: str, run: Path | None, extra: list[str], run_dir: Path | None = None) -> dict:
    _, _, multi, config = DATASETS[name]
    seconds = None
    if run is None:
        run = run_dir or REPO / "runs" / (f"{config}-few" if "--data.unlabeled" in extra else config)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "training.cli", "fit", "--config", str(REPO / "data" / "configs" / f"{config}.yaml"),
             "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(run),
             "--export.register", "false", "--export.faithfulness", "0", *extra],
            cwd=REPO, check=True,
        )
        seconds = time.perf_counter() - start
    metadata = json.loads((run / "model" / "config.json").read_text())["metadata"]
    test = metadata["metrics"]["test"]
    epochs = _epoch_figures(run)
    return {
        "dataset": name, "model": "HAN", "metric": "micro-F1" if multi else "accuracy",
        "score": test["micro_f1"] if multi else test["accuracy"],
        "train_s": seconds if seconds is not None else sum(e["epoch_seconds"] for e in epochs) or None,
        "epochs": epochs,
    }


def _epoch_figures(run: Path) -> list[dict]:
    logs = sorted((run / "csv").glob("version_*/metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return []
    rows = [r for r in csv.DictReader(logs[-1].open()) if r.get("train/epoch_seconds")]
    keys = ("epoch_seconds", "docs_per_s", "words_per_s")
    return [{k: float(r[f"train/{k}"]) for k in keys} for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("datasets", nargs="*", help=f"some of {', '.join(DATASETS)} (default: all four)")
    parser.add_argument("--suite", action="store_true", help="the development suite of settings (benchmarks/suite.py)")
    parser.add_argument("--only", nargs="*", help="with --suite: these settings only")
    parser.add_argument("--vectors", nargs="*", default=["recipe"], choices=["recipe", "word2vec", "glove"],
                        help="with --suite: the recipe's word vectors, vectors built from the data, GloVe 6B 50d")
    parser.add_argument("--jobs", type=int, default=1, help="with --suite: fits at a time, each on its own core")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "suite", help="with --suite: where runs go")
    parser.add_argument("--han-run", type=Path, help="read the HAN's figures from this finished run (one dataset)")
    parser.add_argument("--skip-han", action="store_true", help="baseline only")
    parser.add_argument("--labelled", type=int, help="few labels: train on N labelled documents, the rest unlabelled")
    parser.add_argument("--run-dir", type=Path, help="train the HAN in this folder (default runs/<config>[-few])")
    parser.add_argument("--han-args", default="", help="extra han-train overrides, e.g. '--model.dropout 0.4'")
    args = parser.parse_args()
    if unknown := set(args.datasets) - set(DATASETS):
        parser.error(f"unknown datasets: {', '.join(sorted(unknown))} (choose from {', '.join(DATASETS)})")
    apply_defaults()
    if args.suite:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import suite

        suite.main(args.only, args.vectors, args.jobs, args.runs)
        return
    rows = []
    workdir = Path(tempfile.mkdtemp(prefix="han-accuracy-"))
    for name in args.datasets or list(DATASETS):
        extra = shlex.split(args.han_args)
        train_path = None
        if args.labelled:
            train_path, unlabeled = few_labels(name, args.labelled, workdir)
            extra = ["--config", str(REPO / "data" / "configs" / "small_data.yaml"), "--data.train", str(train_path),
                     "--data.unlabeled", str(unlabeled), *extra]
        rows.append(baseline(name, train_path))
        if not args.skip_han:
            rows.append(han(name, args.han_run, extra, args.run_dir and args.run_dir / name))
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, CPU only\n")
    print("| dataset | model | metric | test score | train time (s) |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        train_s = f"{r['train_s']:.0f}" if r.get("train_s") else "-"
        print(f"| {r['dataset']} | {r['model']} | {r['metric']} | {r['score']:.4f} | {train_s} |")
    for r in rows:
        for i, e in enumerate(r.get("epochs", [])):
            print(f"{r['dataset']} HAN epoch {i}: {e['epoch_seconds']:.1f} s, {e['docs_per_s']:.0f} docs/s, "
                  f"{e['words_per_s']:.0f} words/s")


if __name__ == "__main__":
    main()
