"""The development suite: the default recipe against TF-IDF + logistic regression across settings.

    python benchmarks/accuracy.py --suite                      # every setting, the recipe's word vectors
    python benchmarks/accuracy.py --suite --jobs 2             # two fits at a time, one core each
    python benchmarks/accuracy.py --suite --only imdb-1000 reuters-titles --vectors word2vec glove

Settings, not corpora: sizes (IMDB at 1,000 to 25,000 labels, 20 Newsgroups at 2,000 and in full;
the few-label ones also with the rest of their training split as unlabelled text, ``*-unlabelled``,
which the recipe self-trains on), tasks (binary, 20 classes, 90 labels multi-label) and lengths
(Reuters titles and 20 Newsgroups subject lines alone, one or two sentences each). Every fit is the
plain ``han-train fit --data.train FILE --data.test FILE`` a user without a dataset config runs: the
recipe (training/recipe.py) chooses the rest from the data on its validation split, and the same fit trains
the baseline on the same training split (training/baseline.py). The test split only reads the
result. A run whose model directory exists is read, not retrained (delete it to rerun).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("HAN_SHARED_DATASETS", REPO.parent / "shared" / "datasets"))
# the recipe's choice (GloVe for short English texts, else word2vec), or one of them whatever the data
VECTORS = {"recipe": [], "word2vec": ["--model.embeddings", "word2vec"],
           "glove": ["--model.embeddings", "glove-6b-50d"]}


def split_rows(table: pa.Table, n: int, column: str) -> tuple[list[int], list[int]]:
    """The rows of a stratified sample of n (seed 0) and the rest, each in file order."""
    from sklearn.model_selection import train_test_split

    keep, rest = train_test_split(list(range(len(table))), train_size=n, random_state=0,
                                  stratify=table.column(column).to_pylist())
    return sorted(keep), sorted(rest)


def _sample(table: pa.Table, n: int, column: str) -> pa.Table:
    """A stratified sample of n rows (seed 0), in file order."""
    return table.take(split_rows(table, n, column)[0])


def _rest(table: pa.Table, n: int, column: str) -> pa.Table:
    """The training documents ``_sample`` leaves out, text only: unlabelled text of the same kind."""
    return table.take(split_rows(table, n, column)[1]).select(["text"])


def _title(table: pa.Table) -> pa.Table:
    """Reuters' title line alone (the text is the title, a blank line, then the body)."""
    titles = [t.split("\n", 1)[0].strip() or t[:80] for t in table.column("text").to_pylist()]
    return table.set_column(table.schema.get_field_index("text"), "text", pa.array(titles))


def _subject(table: pa.Table) -> pa.Table:
    """A 20 Newsgroups post's Subject: header alone."""
    def subject(text: str) -> str:
        for line in text.splitlines():
            if line.startswith("Subject:"):
                return line.removeprefix("Subject:").strip() or "(no subject)"
        return "(no subject)"
    subjects = [subject(t) for t in table.column("text").to_pylist()]
    return table.set_column(table.schema.get_field_index("text"), "text", pa.array(subjects))


# name: (corpus folder, how the training table is made, how the test table is made)
# (None: the corpus's file as it is)
Transform = Callable[[pa.Table], pa.Table] | None
SETTINGS: dict[str, tuple[str, Transform, Transform]] = {
    "imdb-1000": ("imdb", lambda t: _sample(t, 1000, "label"), None),
    "imdb-2000": ("imdb", lambda t: _sample(t, 2000, "label"), None),
    "imdb-6400": ("imdb", lambda t: _sample(t, 6400, "label"), None),
    "imdb-25000": ("imdb", None, None),
    "20ng-2000": ("20newsgroups", lambda t: _sample(t, 2000, "label"), None),
    "20ng-full": ("20newsgroups", None, None),
    "reuters-full": ("reuters21578", None, None),
    "reuters-titles": ("reuters21578", _title, _title),
    "20ng-subjects": ("20newsgroups", _subject, _subject),
}
# name: the setting it extends with the rest of its training split as --data.unlabeled (text only)
UNLABELLED: dict[str, tuple[str, Callable[[pa.Table], pa.Table]]] = {
    "imdb-1000-unlabelled": ("imdb-1000", lambda t: _rest(t, 1000, "label")),
    "imdb-2000-unlabelled": ("imdb-2000", lambda t: _rest(t, 2000, "label")),
    "20ng-2000-unlabelled": ("20ng-2000", lambda t: _rest(t, 2000, "label")),
}
SETTINGS |= {name: SETTINGS[base] for name, (base, _) in UNLABELLED.items()}
# The order they run in: the settings where the baseline is hardest to beat (few labels, short texts) first.
ORDER = ["imdb-1000", "reuters-titles", "20ng-subjects", "imdb-2000", "20ng-2000", "imdb-1000-unlabelled",
         "imdb-2000-unlabelled", "20ng-2000-unlabelled", "imdb-6400", "reuters-full", "imdb-25000", "20ng-full"]


def setting_files(name: str, workdir: Path) -> tuple[Path, Path, Path | None]:
    """The setting's training, test and unlabelled files (Parquet, written once into workdir)."""
    folder, train_of, test_of = SETTINGS[name]
    base, rest_of = UNLABELLED.get(name, (name, None))
    paths: list[Path | None] = []
    for split, transform in (("train", train_of), ("test", test_of), ("unlabelled", rest_of)):
        if transform is None:  # the corpus's own file: its tokenisation cache serves every setting
            paths.append(None if split == "unlabelled" else SHARED / folder / f"{split}.parquet")
            continue
        path = workdir / f"{base}-{split}.parquet"
        source = SHARED / folder / f"{'test' if split == 'test' else 'train'}.parquet"
        if not path.is_file():
            workdir.mkdir(parents=True, exist_ok=True)
            columns = ["text", "labels" if folder == "reuters21578" else "label"]
            pq.write_table(transform(pq.read_table(source, columns=columns)), path)
        paths.append(path)
    return paths[0], paths[1], paths[2]  # type: ignore[return-value]


def command(name: str, vectors: str, workdir: Path, runs: Path) -> tuple[list[str], Path]:
    train, test, unlabelled = setting_files(name, workdir)
    run = runs / f"{name}-{vectors}"
    label = ["--data.label_column", "labels"] if SETTINGS[name][0] == "reuters21578" else []
    more = ["--data.unlabeled", str(unlabelled)] if unlabelled else []
    return [sys.executable, "-m", "training.cli", "fit", "--data.train", str(train), "--data.test", str(test),
            *label, *more, *VECTORS[vectors], "--trainer.default_root_dir", str(run), "--export.register", "false",
            "--trainer.enable_progress_bar", "false"], run


def result(name: str, vectors: str, run: Path) -> dict[str, Any]:
    """The figures a finished run's model directory and reports hold."""
    metadata = json.loads((run / "model" / "config.json").read_text())["metadata"]
    metrics, baseline = metadata["metrics"], metadata.get("baseline") or {}
    key = "micro_f1" if "micro_f1" in metrics.get("test", {}) else "accuracy"
    timing = json.loads((run / "suite-timing.json").read_text()) if (run / "suite-timing.json").is_file() else {}
    faith = metadata.get("faithfulness") or {}
    return {
        "setting": name, "vectors": vectors, "metric": key,
        "han_validation": metrics.get("validation", {}).get(key), "han_test": metrics["test"][key],
        "baseline_validation": (baseline.get("validation") or {}).get(key),
        "baseline_test": (baseline.get("test") or {}).get(key),
        "epochs": metadata.get("epochs"), "fit_s": timing.get("seconds"),
        "faithfulness_s": faith.get("seconds"), "faithfulness_documents": faith.get("documents"),
        "han_alone_test": metrics["test"].get(f"han_alone_{key}", metrics["test"][key]),
        "han_share": (metadata.get("ngram_head") or {}).get("han_share", 1.0),
    }


def run_suite(names: list[str], vectors: list[str], jobs: int, workdir: Path, runs: Path) -> list[dict[str, Any]]:
    """Every (setting, vectors) fit, ``jobs`` at a time, each pinned to its own core with one thread."""
    queue = [(n, v) for n in names for v in vectors]
    running: dict[int, tuple[subprocess.Popen, str, str, Path, float, Any]] = {}
    cores = list(range(jobs))
    while queue or running:
        while queue and len(running) < jobs:
            name, vec = queue.pop(0)
            cmd, run = command(name, vec, workdir, runs)
            if (run / "model" / "config.json").is_file():
                print(f"{name} {vec}: done before, read from {run}", flush=True)
                continue
            core = next(c for c in cores if c not in running)
            run.mkdir(parents=True, exist_ok=True)
            log = (run / "suite.log").open("w")
            env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
            pinned = ["taskset", "-c", str(core), *cmd] if jobs > 1 and _has_taskset() else cmd
            print(f"{name} {vec}: started on core {core}: {' '.join(cmd[2:])}", flush=True)
            process = subprocess.Popen(pinned, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
            running[core] = (process, name, vec, run, time.perf_counter(), log)
        time.sleep(2)
        for core, (process, name, vec, run, start, log) in list(running.items()):
            if process.poll() is None:
                continue
            seconds = time.perf_counter() - start
            log.close()
            del running[core]
            (run / "suite-timing.json").write_text(json.dumps({"seconds": seconds, "returncode": process.returncode}))
            print(f"{name} {vec}: exit {process.returncode} after {seconds:.0f} s (log: {run / 'suite.log'})",
                  flush=True)
    rows = []
    for name in names:
        for vec in vectors:
            run = runs / f"{name}-{vec}"
            if (run / "model" / "config.json").is_file():
                rows.append(result(name, vec, run))
            elif (run / "suite-timing.json").is_file():
                code = json.loads((run / "suite-timing.json").read_text())["returncode"]
                print(f"{name} {vec}: no model (exit {code}); see {run / 'suite.log'}", flush=True)
    return rows


def _has_taskset() -> bool:
    return subprocess.run(["which", "taskset"], capture_output=True).returncode == 0


def table(rows: list[dict[str, Any]]) -> str:
    def f(x: Any) -> str:
        return "-" if x is None else f"{x:.4f}" if isinstance(x, float) else str(x)

    def margin(x: float | None, base: float | None) -> str:
        return "-" if x is None or base is None else f"{x - base:+.4f}"

    lines = ["| setting | vectors | metric | model test | baseline test | model - baseline | HAN share "
             "| HAN alone test | HAN alone - baseline | model val | baseline val | epochs | fit (s) "
             "| faithfulness (s, docs) |",
             "|" + " --- |" * 14]
    for r in rows:
        alone = r.get("han_alone_test", r["han_test"])
        share = (f"{r['faithfulness_s']:.0f}, {r['faithfulness_documents']}" if r["faithfulness_s"] is not None
                 else "-")
        lines.append(f"| {r['setting']} | {r['vectors']} | {r['metric']} | {f(r['han_test'])} "
                     f"| {f(r['baseline_test'])} | {margin(r['han_test'], r['baseline_test'])} "
                     f"| {r.get('han_share', 1.0):.2f} | {f(alone)} | {margin(alone, r['baseline_test'])} "
                     f"| {f(r['han_validation'])} | {f(r['baseline_validation'])} | {f(r['epochs'])} "
                     f"| {'-' if r['fit_s'] is None else round(r['fit_s'])} | {share} |")
    return "\n".join(lines)


def main(only: list[str] | None, vectors: list[str], jobs: int, runs: Path) -> None:
    names = [n for n in ORDER if not only or n in only]
    unknown = set(only or []) - set(SETTINGS)
    if unknown:
        sys.exit(f"unknown settings: {', '.join(sorted(unknown))} (choose from {', '.join(ORDER)})")
    rows = run_suite(names, vectors, jobs, REPO / ".cache" / "suite-data", runs)
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"one core and one torch thread per fit, {jobs} at a time; load average {os.getloadavg()[0]:.2f}\n")
    print(table(rows))
    (runs / "suite.json").write_text(json.dumps(rows, indent=1))
