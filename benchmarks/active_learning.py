"""What the labelling queue is worth: accuracy against labels, a query strategy against random sampling.

    python benchmarks/active_learning.py run imdb 20newsgroups --strategies uncertainty random --seeds 0 1 2 --jobs 2
    python benchmarks/active_learning.py report            # the curves and figures of what has run

The pool is a corpus's training split with its labels hidden, less 1,000 documents held out as a
validation split (what a strategy is chosen on); the test split (a fixed sample of ``--test-sample``
documents, the same for every run) reads the result. Each seed starts from ``--start`` random labels
and a fit from scratch (word2vec built from the pool's text, as ``--data.unlabeled`` gives it, and no
self-training), shared by the strategies. Then each round, as a user would: the last round's model
scores the pool (``Pipeline.with_vectors``, the one inference path), ``labeling.strategies.choose``
picks ``--step`` documents, their labels are revealed, and ``han-train fit --data.train labelled.jsonl
--model.init_from LAST_MODEL`` trains the next model; up to ``--budget`` labels.

Each (corpus, seed, strategy) runs as its own process pinned to one core (``taskset``, one torch
thread) and appends a JSON line per round to ``DIR/results.jsonl``; a run that is stopped resumes at
its next round. The report prints, per corpus: the mean accuracy of each strategy at each label count
(with the seeds' spread, max - min), the labels each strategy needs to reach random's mean accuracy at
the budget (linear between rounds), and each round's time (fit, query, evaluation).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from han.environment import apply_defaults  # noqa: E402
from han.pipeline import Pipeline  # noqa: E402

SHARED = Path(os.environ.get("HAN_SHARED_DATASETS", REPO.parent / "shared" / "datasets"))
CORPORA = {"imdb": "imdb", "20newsgroups": "20newsgroups"}
VALIDATION = 1_000  # held out of the pool: the strategy's choice is read here
SPLIT_SEED = 12_345  # the validation split and the test sample: the same for every run


def load(corpus: str, test_sample: int) -> tuple[list[str], list[str], list[str], list[str], list[str], list[str]]:
    """(pool texts, pool labels, validation texts, validation labels, test texts, test labels)."""
    import pyarrow.parquet as pq

    train = pq.read_table(SHARED / CORPORA[corpus] / "train.parquet", columns=["text", "label"]).to_pydict()
    test = pq.read_table(SHARED / CORPORA[corpus] / "test.parquet", columns=["text", "label"]).to_pydict()
    rng = np.random.default_rng(SPLIT_SEED)
    order = rng.permutation(len(train["text"]))
    val, pool = order[:VALIDATION], np.sort(order[VALIDATION:])
    sample = np.arange(len(test["text"]))
    if 0 < test_sample < len(sample):
        sample = np.sort(rng.choice(sample, test_sample, replace=False))
    pick = lambda col, rows: [col[i] for i in rows]  # noqa: E731
    return (pick(train["text"], pool), pick(train["label"], pool), pick(train["text"], val),
            pick(train["label"], val), pick(test["text"], sample), pick(test["label"], sample))


def write_labelled(path: Path, rows: list[int], texts: list[str], labels: list[str]) -> None:
    with path.open("w") as f:
        for i in rows:
            f.write(json.dumps({"id": f"pool-{i}", "text": texts[i], "label": labels[i]}) + "\n")


def fit(workdir: Path, train: Path, seed: int, init_from: Path | None, unlabeled: Path | None,
        validation: Path | None = None) -> Path:
    """One ``han-train fit``, as a user runs it; returns the model directory."""
    model = workdir / "model"
    if (model / "config.json").exists():
        return model
    cmd = [sys.executable, "-m", "training.cli", "fit", "--data.train", str(train), "--seed_everything", str(seed),
           "--export.register", "false", "--export.faithfulness", "0", "--export.output_dir", str(workdir),
           "--trainer.default_root_dir", str(workdir / "run"), "--trainer.enable_progress_bar", "false"]
    if init_from is not None:
        cmd += ["--model.init_from", str(init_from)]
    if unlabeled is not None:
        cmd += ["--data.unlabeled", str(unlabeled), "--self_training.fraction", "0"]
    if validation is not None:
        cmd += ["--data.validation", str(validation)]
    with (workdir / "fit.log").open("w") as log:
        done = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode or not (model / "config.json").exists():
        raise SystemExit(f"the fit in {workdir} failed: see {workdir / 'fit.log'}")
    return model


def accuracy(pipeline: Pipeline, texts: list[str], labels: list[str]) -> float:
    results = pipeline(texts, errors="return")
    return float(np.mean([getattr(r, "label", None) == y for r, y in zip(results, labels, strict=True)]))


def run_one(args: argparse.Namespace) -> None:
    """One corpus, seed and strategy, round by round (resuming after the last round written)."""
    import torch

    from labeling.strategies import choose

    torch.set_num_threads(1)
    corpus, seed, strategy = args.corpus, args.seed, args.strategy
    root = Path(args.dir) / corpus / f"seed{seed}"
    root.mkdir(parents=True, exist_ok=True)
    pool_texts, pool_labels, val_texts, val_labels, test_texts, test_labels = load(corpus, args.test_sample)
    unlabeled = root / "pool.parquet"
    if not unlabeled.exists():
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": pool_texts}), unlabeled.with_suffix(".tmp"))
        unlabeled.with_suffix(".tmp").rename(unlabeled)
    start = np.sort(np.random.default_rng(seed).choice(len(pool_texts), args.start, replace=False)).tolist()
    # STRATEGY-dev: a tenth of each round's labels (and of the start's) drawn at random and kept apart as
    # the fits' validation split, the rest chosen by STRATEGY: every choice the fit makes (early stopping,
    # the n-gram head's share) is then read on documents like the traffic, not on the least certain ones
    base, dev = strategy.removesuffix("-dev"), strategy.endswith("-dev")
    dev_rows: list[int] = sorted(np.random.default_rng(seed + 1).choice(start, args.start // 10, replace=False)
                                 .tolist()) if dev else []
    results = Path(args.dir) / "results.jsonl"
    mine = (corpus, seed, strategy)
    done = {r["labels"] for r in _results(results) if (r["corpus"], r["seed"], r["strategy"]) == mine}
    labelled: list[int] = list(start)
    previous: Path | None = None
    for size in range(args.start, args.budget + 1, args.step):
        shared = size == args.start  # the first model is every strategy's ("start"/"start-dev" fit only it)
        if base == "start" and not shared:
            return
        workdir = root / (("start-dev" if dev else "start") if shared else f"{strategy}-{size}")
        workdir.mkdir(parents=True, exist_ok=True)
        chosen_file = workdir / "labelled.json"
        query_s = 0.0
        if not shared:
            if chosen_file.exists():
                saved = json.loads(chosen_file.read_text())
                labelled, dev_rows = (saved["labelled"], saved["dev"]) if dev else (saved, [])
            else:
                t = time.perf_counter()
                rest = np.setdiff1d(np.arange(len(pool_texts)), labelled)
                if dev:
                    drawn = np.random.default_rng(seed * 1000 + size + 1).choice(rest, args.step // 10, replace=False)
                    dev_rows = sorted(dev_rows + drawn.tolist())
                    labelled = labelled + drawn.tolist()
                    rest = np.setdiff1d(rest, drawn)
                take = args.step - (args.step // 10 if dev else 0)
                if base == "random":
                    probs, vectors = np.zeros((len(rest), 2)), None
                else:
                    scored = Pipeline.from_directory(previous)  # type: ignore[arg-type]
                    out, vectors = scored.with_vectors([pool_texts[i] for i in rest])
                    probs = np.array([[r.scores[k] for k in scored.labels] for r in out])
                picked = choose(base, take, probs, vectors, seed=seed * 1000 + size, multi_label=False)
                labelled = labelled + rest[picked].tolist()
                query_s = time.perf_counter() - t
                chosen_file.write_text(json.dumps({"labelled": labelled, "dev": dev_rows} if dev else labelled))
        train = workdir / "labelled.jsonl"
        held = set(dev_rows)
        write_labelled(train, [i for i in labelled if i not in held], pool_texts, pool_labels)
        validation = None
        if dev:
            validation = workdir / "dev.jsonl"
            write_labelled(validation, dev_rows, pool_texts, pool_labels)
        t = time.perf_counter()
        model = fit(workdir, train, seed, previous, unlabeled if shared else None, validation)
        fit_s = time.perf_counter() - t
        previous = model
        if size in done or base == "start":
            continue
        t = time.perf_counter()
        pipeline = Pipeline.from_directory(model)
        val_acc, test_acc = accuracy(pipeline, val_texts, val_labels), accuracy(pipeline, test_texts, test_labels)
        row = {"corpus": corpus, "seed": seed, "strategy": strategy, "labels": size, "validation": round(val_acc, 4),
               "test": round(test_acc, 4), "fit_s": round(fit_s, 1), "query_s": round(query_s, 1),
               "eval_s": round(time.perf_counter() - t, 1), "at": time.strftime("%Y-%m-%d %H:%M")}
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def _results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _start_of(job: tuple[str, int, str]) -> tuple[str, int, str] | None:
    """The job that fits the (corpus, seed)'s shared first model a strategy's job starts from (``start``,
    or ``start-dev`` for the ``-dev`` strategies, whose first fit keeps a validation split apart), or None
    for a start job itself."""
    corpus, seed, strategy = job
    if strategy in ("start", "start-dev"):
        return None
    return corpus, seed, "start-dev" if strategy.endswith("-dev") else "start"


def run_all(args: argparse.Namespace) -> None:
    """Every (corpus, seed, strategy), ``--jobs`` at a time, each pinned to its own core: first the
    shared first fit of each (corpus, seed), then the strategies, seeds and corpora interleaved. A
    strategy's job starts only once its (corpus, seed)'s first fit has ended (it reads that model, and
    must not fit it into the same folder at the same time); other pairs' jobs take the free cores."""
    pairs = sorted(itertools.product(args.corpora, args.seeds), key=lambda p: (p[1], args.corpora.index(p[0])))
    main, extra = args.strategies[:2], args.strategies[2:]  # the default and random first, for every seed
    starts = ["start"] + (["start-dev"] if any(k.endswith("-dev") for k in args.strategies) else [])
    jobs = [(c, s, k) for c, s in pairs for k in starts] + [(c, s, k) for c, s in pairs for k in main] + \
        [(c, s, k) for c, s in pairs for k in extra]
    running: list[tuple[subprocess.Popen, int, tuple]] = []
    ended: dict[tuple, int] = {}  # job -> exit code
    free = list(range(args.jobs))
    log_dir = Path(args.dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    while jobs or running:
        for job in [j for j in jobs if (first := _start_of(j)) is not None and ended.get(first, 0)]:
            jobs.remove(job)  # its first fit failed: it would fit it again, as would every other strategy
            print(f"{time.strftime('%H:%M:%S')} skipped {job}: {_start_of(job)} failed", flush=True)
        while free:
            job = next((j for j in jobs if (first := _start_of(j)) is None or first in ended), None)
            if job is None:  # every job left waits for a first fit still running
                break
            jobs.remove(job)
            corpus, seed, strategy = job
            core = free.pop(0)
            cmd = ["taskset", "-c", str(core % (os.cpu_count() or 1)), sys.executable, __file__, "one", corpus,
                   str(seed), strategy, "--dir", args.dir, "--start", str(args.start), "--step", str(args.step),
                   "--budget", str(args.budget), "--test-sample", str(args.test_sample)]
            with (log_dir / f"{corpus}-{seed}-{strategy}.log").open("a") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                        env=os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
            running.append((proc, core, job))
            print(f"{time.strftime('%H:%M:%S')} started {corpus} seed {seed} {strategy} on core {core}", flush=True)
        time.sleep(5)
        for proc, core, job in list(running):
            if proc.poll() is not None:
                running.remove((proc, core, job))
                free.append(core)
                ended[job] = proc.returncode
                print(f"{time.strftime('%H:%M:%S')} ended {job} (exit {proc.returncode})", flush=True)


def report(args: argparse.Namespace) -> None:
    rows = _results(Path(args.dir) / "results.jsonl")
    for corpus in sorted({r["corpus"] for r in rows}):
        mine = [r for r in rows if r["corpus"] == corpus]
        strategies = sorted({r["strategy"] for r in mine}, key=lambda s: s == "random")
        sizes = sorted({r["labels"] for r in mine})
        print(f"\n{corpus}: {args.split} accuracy, the mean of the seeds (spread: max - min, n: seeds), and the "
              "round's time on one core (query + fit, mean)")
        print("| labels | " + " | ".join(strategies) + " |")
        print("|---:|" + "---:|" * len(strategies))
        curves: dict[str, dict[int, float]] = {s: {} for s in strategies}
        for size in sizes:
            cells = []
            for s in strategies:
                at = [r for r in mine if r["labels"] == size and r["strategy"] == s]
                if not at:
                    cells.append("")
                    continue
                values = [r[args.split] for r in at]
                curves[s][size] = float(np.mean(values))
                spent = np.mean([r["query_s"] + r["fit_s"] for r in at])
                cells.append(f"{np.mean(values):.4f} (spread {max(values) - min(values):.4f}, n={len(values)}; "
                             f"{spent:.0f} s)")
            print(f"| {size:,} | " + " | ".join(cells) + " |")
        if curves.get("random"):
            top = max(curves["random"])
            target = curves["random"][top]
            print(f"random at {top:,} labels: {target:.4f}; the labels each strategy needs to reach it "
                  "(linear between rounds):")
            for s, curve in curves.items():
                need = _labels_to_reach(curve, target)
                print(f"  {s}: " + (f"{need:,.0f} ({need / top:.2f} of random's)" if need else "not reached"))
            for s in strategies:
                below = [(size, curves["random"][size] - curve_s) for size, curve_s in curves[s].items()
                         if size in curves["random"]]
                spread = {size: max(_spread(mine, size, s, args.split), _spread(mine, size, "random", args.split))
                          for size in sizes}
                worse = [f"{size:,} ({-d:+.4f}, spread {spread[size]:.4f})" for size, d in below if d > spread[size]]
                if s != "random":
                    print(f"  {s} below random by more than its seeds' spread at: {', '.join(worse) or 'no round'}")


def _spread(rows: list[dict], size: int, strategy: str, split: str) -> float:
    """max - min over the seeds (the larger of the two strategies' is the noise a round is read against)."""
    values = [r[split] for r in rows if r["labels"] == size and r["strategy"] == strategy]
    return max(values) - min(values) if values else 0.0


def _labels_to_reach(curve: dict[int, float], target: float) -> float | None:
    points = sorted(curve.items())
    for (a, fa), (b, fb) in itertools.pairwise(points):
        if fb >= target > fa:
            return a + (b - a) * (target - fa) / (fb - fa)
    if points and points[0][1] >= target:
        return float(points[0][0])
    return None


def main() -> None:
    apply_defaults()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default="runs/active_learning")
    common.add_argument("--start", type=int, default=200)
    common.add_argument("--step", type=int, default=200)
    common.add_argument("--budget", type=int, default=2000)
    common.add_argument("--test-sample", type=int, default=5000, help="test documents read (0: all)")
    run = sub.add_parser("run", parents=[common])
    run.add_argument("corpora", nargs="+", choices=sorted(CORPORA))
    run.add_argument("--strategies", nargs="+", default=["uncertainty", "random"],
                     help="the first two run for every seed before the others")
    run.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    run.add_argument("--jobs", type=int, default=2)
    one = sub.add_parser("one", parents=[common])
    one.add_argument("corpus", choices=sorted(CORPORA))
    one.add_argument("seed", type=int)
    one.add_argument("strategy")
    rep = sub.add_parser("report", parents=[common])
    rep.add_argument("--split", choices=["test", "validation"], default="test")
    args = parser.parse_args()
    {"run": run_all, "one": run_one, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
