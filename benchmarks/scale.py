"""Does a fit scale with its corpus? Each stage's time and the peak memory at 100,000 to 1,000,000 documents.

    python benchmarks/scale.py build                           # runs/scale/scale-{100000,300000,1000000}.parquet
    python benchmarks/scale.py run --sizes 100000 300000       # a fit each: a table row, a line of results.jsonl
    python benchmarks/scale.py build --sizes 4000 && python benchmarks/scale.py run --sizes 4000   # a try-out

No labelled corpus of a million documents is at hand, so ``build`` makes them from real sentences: those
of the shared IMDB and 20 Newsgroups training splits (the test file's: their test splits), split with a
regex (4-60 words, mostly letters; a post's headers and quoted lines left out). The 22 classes are the
sources: the 20 newsgroups, IMDB's negative and its positive reviews. A document takes its sentence count
from an IMDB review (about 190 words, as IMDB), a strict majority of its sentences (n // 2 + 1) from its
label's class and the rest from classes drawn at random, shuffled: the label is the majority source,
which topic words (sentiment, for IMDB's two) say, so it is learnable but not from any one sentence.
Blocks of 10,000 documents are drawn each from its own seed (the seed, the block's number) and written a
row group each: one seed gives byte-identical files, a smaller corpus is the start of a larger one, and
memory stays flat. Sentences repeat (at 1,000,000 documents a 20 Newsgroups one about 80 times), so the
vocabulary and the baseline's n-grams stop growing sooner than a real corpus's would.

``run`` runs the fit a user without a config runs (``han-train fit --data.train FILE --data.test FILE``,
the recipe choosing the rest) with one epoch (``--epochs``), seed 0, no registration and fresh caches,
pinned with taskset and OMP_NUM_THREADS (``--cores``; ``none`` leaves it be). Stages are timed by when
the fit's log lines arrive: load (start-up, reading the file, the recipe's profile), tokenise (up to the
word vectors: segmenting, vocabulary, encoding, the validation split), vectors (word2vec), epoch (training
and its validation), baseline (TF-IDF + logistic regression, fit and scoring), export (the rest up to the
model directory: calibration, n-gram head, reports, faithfulness). "peak MiB" is the summed PSS of the
fit and its forked tokenising processes (sampled each second; summed RSS, kept too, counts the pages the
forks share with the fit in each of them), with the stage it fell in; "anon MiB" the same without the
pages of mapped files (the caches on disk, which the system reclaims); "fit MiB" the largest process's
exact peak RSS (ru_maxrss). ``DIR/results.jsonl`` adds every stage's peak and the fit's step timings;
``DIR/run-N/fit.log`` is the fit's log, each line's arrival time first. Memory is in MiB (2**20 bytes)
throughout, the ``*_mb`` fields of results.jsonl too (their names kept, for the lines already there).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("HAN_SHARED_DATASETS", REPO.parent / "shared" / "datasets"))
BLOCK = 10_000  # documents drawn from one seed and written as one row group
POLL, PSS_EVERY = 0.2, 5  # seconds between memory samples; every 5th also reads PSS (slower)
SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("label", pa.string())])
STAGES = ["load", "tokenise", "vectors", "epoch", "baseline", "export"]
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')]*\s+(?=[\"'(]?[A-Z0-9])|\n\s*\n")


def sentences(text: str, post: bool) -> list[str]:
    """A text's sentences of 4-60 words, mostly letters, whitespace collapsed; of a Usenet post, the body
    without quoted or attribution lines."""
    if post:
        text = "\n".join(line for line in text.split("\n\n", 1)[-1].split("\n")
                         if not line.lstrip().startswith((">", "|", ":")) and not re.search(r"wr(ites|ote):", line))
    else:
        text = re.sub(r"<\s*br\s*/?\s*>", " \n\n", text, flags=re.IGNORECASE)
    kept = []
    for part in _BOUNDARY.split(text):
        sentence = " ".join(part.split())
        if 4 <= sentence.count(" ") + 1 <= 60 and sum(c.isalpha() for c in sentence) >= 0.6 * len(sentence):
            kept.append(sentence if sentence[-1] in ".!?\"')" else sentence + ".")
    return kept


@dataclass
class Pool:
    """A split's sentences by class (class k's: ``text[offsets[k]:offsets[k] + sizes[k]]``) and its IMDB
    reviews' sentence counts (what a document's length is drawn from)."""

    classes: list[str]
    text: list[str]
    offsets: np.ndarray
    sizes: np.ndarray
    lengths: np.ndarray


def pool(split: str) -> Pool:
    by_class: dict[str, list[str]] = {}
    lengths = []
    for corpus in ("20newsgroups", "imdb"):
        table = pq.read_table(SHARED / corpus / f"{split}.parquet", columns=["text", "label"]).to_pydict()
        for text, label in zip(table["text"], table["label"], strict=True):
            found = sentences(text, post=corpus == "20newsgroups")
            by_class.setdefault(label if corpus == "20newsgroups" else f"imdb-{label}", []).extend(found)
            if corpus == "imdb":
                lengths.append(len(found))
    classes = sorted(by_class)
    sizes = np.array([len(by_class[c]) for c in classes])
    return Pool(classes, [s for c in classes for s in by_class[c]], np.cumsum(sizes) - sizes, sizes,
                np.clip(lengths, 3, 50))


def block(p: Pool, seed: int, stream: int, index: int) -> pa.Table:
    """Documents ``index * BLOCK`` onwards of a corpus (stream 0) or of the test file (stream 1)."""
    rng = np.random.default_rng([seed, stream, index])
    n = rng.choice(p.lengths, BLOCK)
    label = rng.integers(0, len(p.classes), BLOCK)
    doc = np.repeat(np.arange(BLOCK), n)
    slot = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)  # a sentence's place in its document
    source = np.where(slot <= np.repeat(n // 2, n), label[doc], rng.integers(0, len(p.classes), n.sum()))
    pick = p.offsets[source] + (rng.random(n.sum()) * p.sizes[source]).astype(np.int64)
    pick = pick[np.lexsort((rng.random(n.sum()), doc))].tolist()  # shuffled within each document
    ends = np.cumsum(n).tolist()
    texts = [" ".join(p.text[i] for i in pick[start:end]) for start, end in zip([0, *ends[:-1]], ends, strict=True)]
    ids = [f"{'test' if stream else 'doc'}-{index * BLOCK + i:07d}" for i in range(BLOCK)]
    return pa.table([ids, texts, [p.classes[k] for k in label.tolist()]], schema=SCHEMA)


def build(args: argparse.Namespace) -> None:
    args.dir.mkdir(parents=True, exist_ok=True)
    for split, stream, sizes in (("train", 0, args.sizes), ("test", 1, [args.test_size])):
        started = time.monotonic()
        p = pool(split)
        print(f"{split} sentences: {len(p.text):,} in {len(p.classes)} classes ({p.sizes.min():,} to "
              f"{p.sizes.max():,}), {time.monotonic() - started:.1f} s", flush=True)
        for n in sizes:
            started, path = time.monotonic(), args.dir / f"scale-{n if stream == 0 else 'test'}.parquet"
            partial = path.with_suffix(".partial")  # never a half-written corpus under the real name
            with pq.ParquetWriter(partial, SCHEMA, compression="zstd") as writer:
                for index in range(-(-n // BLOCK)):
                    writer.write_table(block(p, args.seed, stream, index).slice(0, n - index * BLOCK))
            partial.replace(path)
            print(f"{path}: {n:,} documents, {path.stat().st_size / 2**20:.1f} MiB, "
                  f"{time.monotonic() - started:.1f} s", flush=True)


def tree_memory(root: psutil.Process, pss: bool) -> tuple[int, int | None, int | None]:
    """Summed RSS of a process and its descendants and (if ``pss``) their summed PSS and anonymous PSS,
    in bytes. Anonymous: PSS less the pages of mapped files (the tokenisation cache, the encoded splits),
    which the system pages in and out: the memory a corpus's size must not grow."""
    rss, proportional, anonymous = 0, 0 if pss else None, 0 if pss else None
    with contextlib.suppress(psutil.Error):
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error, OSError, TypeError):
                rss += process.memory_info().rss
                if proportional is not None and anonymous is not None:
                    rollup = Path(f"/proc/{process.pid}/smaps_rollup").read_text()
                    proportional += int(re.search(r"^Pss:\s+(\d+) kB", rollup, re.M)[1]) * 1024  # type: ignore[index]
                    anonymous += int(re.search(r"^Pss_Anon:\s+(\d+) kB", rollup, re.M)[1]) * 1024  # type: ignore[index]
    return rss, proportional, anonymous


def measure(cmd: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run ``cmd``: its log lines with their arrival times, memory samples, exit code and wall time.
    Every PSS sample also goes to ``memory.tsv`` beside the log as it is taken (seconds, RSS, PSS and
    anonymous PSS in MiB), so a run stopped midway still says where its memory went."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        with log.open("w") as out:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.append((time.monotonic() - started, line.rstrip("\n")))
                out.write(f"{lines[-1][0]:9.2f} {line}")
                out.flush()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    root, samples = psutil.Process(proc.pid), []
    with (log.parent / "memory.tsv").open("w") as trace:
        trace.write("seconds\trss_mib\tpss_mib\tanon_mib\n")
        for poll in itertools.count():
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # usage: the fit's and its reaped children's
            if pid:
                break
            samples.append((time.monotonic() - started, *tree_memory(root, poll % PSS_EVERY == 0)))
            if (sample := samples[-1])[2] is not None:
                trace.write(f"{sample[0]:.1f}\t" + "\t".join(f"{v / 2**20:.0f}" for v in sample[1:]) + "\n")
                trace.flush()
            time.sleep(POLL)
    proc.returncode, wall = os.waitstatus_to_exitcode(status), time.monotonic() - started
    reader.join()
    return {"lines": lines, "samples": samples, "returncode": proc.returncode, "wall": wall,
            "max_process_rss_mb": round(usage.ru_maxrss / 1024)}


def stages(lines: list[tuple[float, str]]) -> dict[str, tuple[float, float] | None]:
    """Each stage's (start, end), seconds from the start, by the log lines that open and close it
    (export's span holds the baseline's)."""
    def first(pattern: str, after: float = 0.0) -> float | None:
        return next((t for t, line in lines if t >= after and re.search(pattern, line)), None)

    recipe, vectors = first(r"^recipe \(training/recipe\.py\)"), first(r"^(word2vec: (counting|reusing)|glove)")
    scored = [t for t, line in lines if re.match(r"^baseline scoring \w+: [\d,]+ documents in ", line)]
    baseline = first(r"^baseline \(.*\) on [\d,]+ training documents \.\.\.$")
    spans = {"load": (0.0, recipe), "tokenise": (recipe, vectors),
             "vectors": (vectors, covered := first(r"^(word2vec|glove-6b-50d) \(.*\): ", vectors or 0)),
             "epoch": (covered, export := first(r"^calibrating on validation: .* \.\.\.$")),
             "baseline": (baseline, scored[-1] if scored else None),
             "export": (export, first(r"^model directory: "))}
    return {k: (a, b) if a is not None and b is not None else None for k, (a, b) in spans.items()}


def stage_peaks(spans: dict[str, tuple[float, float] | None],
                samples: list[tuple[float, int, int | None, int | None]], column: int = 2) -> dict[str, int]:
    """The largest PSS sample (MiB; ``column`` 3: anonymous PSS) in each stage ("other": after the model
    directory is written)."""
    peaks: dict[str, int] = {}
    for sample in samples:
        t, value = sample[0], sample[column]
        inside = [k for k in STAGES if (s := spans[k]) is not None and s[0] <= t < s[1]]
        name = "baseline" if "baseline" in inside else (inside[0] if inside else "other")
        if value is not None:
            peaks[name] = max(peaks.get(name, 0), round(value / 2**20))
    return peaks


def step_seconds(lines: list[tuple[float, str]]) -> dict[str, float]:
    """The fit's own timings: its steps' ("evaluating test: 5,000 documents in 12.3 s"), the training
    epochs' ("epoch 0: 812.4 s, ...") and the baseline's fit."""
    found: dict[str, float] = {}
    for _, line in lines:
        if m := re.match(r"^(.+?): [\d,]+ \w+ in ([\d.]+) s", line) or re.match(r"^(epoch \d+): ([\d.]+) s,", line):
            found[m[1]] = float(m[2])
        elif m := re.match(r"^baseline \(.*\) on [\d,]+ training documents: ([\d.]+) s", line):
            found["baseline fit"] = float(m[1])
    return found


def accuracy(run: Path) -> tuple[float | None, float | None]:
    """Test accuracy of the exported model and of the baseline, from the model directory."""
    with contextlib.suppress(OSError, KeyError, ValueError):
        metadata = json.loads((run / "model" / "config.json").read_text())["metadata"]
        return metadata["metrics"]["test"].get("accuracy"), metadata["baseline"]["test"].get("accuracy")
    return None, None


def run(args: argparse.Namespace) -> None:
    test = args.dir / "scale-test.parquet"
    cores = [] if args.cores == "none" else [c for part in args.cores.split(",") for c in
                                             range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]
    env = os.environ | {"PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    env |= {"OMP_NUM_THREADS": str(len(cores))} if cores else {}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    rows = [f"{'documents':>10} " + " ".join(f"{k:>8}" for k in [*STAGES, "total"])
            + f" {'s/1k docs':>9} {'peak MiB':>8} {'at':>8} {'anon MiB':>8} {'at':>8} {'fit MiB':>7} {'HAN acc':>7}"
            + f" {'base acc':>8}"]
    for n in args.sizes:
        train, out = args.dir / f"scale-{n}.parquet", (args.dir / f"run-{n}").resolve()
        if not train.is_file() or not test.is_file():
            sys.exit(f"{train} or {test} missing: run `python benchmarks/scale.py build --sizes {n}` first")
        shutil.rmtree(out, ignore_errors=True)  # fresh caches: every stage is measured, none read back
        out.mkdir(parents=True)
        cmd = [*(["taskset", "-c", ",".join(map(str, cores))] if cores else []), sys.executable, "-m",
               "training.cli", "fit", "--data.train", str(train.resolve()), "--data.test", str(test.resolve()),
               "--trainer.max_epochs", str(args.epochs), "--seed_everything", "0", "--export.register", "false",
               "--trainer.default_root_dir", str(out), "--trainer.enable_progress_bar", "false",
               "--data.cache_dir", str(out / "cache"), *shlex.split(args.fit_args)]
        print(f"{n:,} documents: running, log {out / 'fit.log'}", flush=True)
        load_before = os.getloadavg()[0]
        result = measure(cmd, env | {"HF_DATASETS_CACHE": str(out / "hf")}, out / "fit.log")
        spans = stages(result["lines"])
        took = {k: None if s is None else round(s[1] - s[0], 1) for k, s in spans.items()}
        if took["export"] is not None and took["baseline"] is not None:
            took["export"] = round(took["export"] - took["baseline"], 1)
        took["total"] = round(result["wall"], 1)
        peaks = stage_peaks(spans, result["samples"])
        at, peak = max(peaks.items(), key=lambda kv: kv[1]) if peaks else ("-", 0)
        anonymous = stage_peaks(spans, result["samples"], column=3)
        anon_at, anon_peak = max(anonymous.items(), key=lambda kv: kv[1]) if anonymous else ("-", 0)
        han, base = accuracy(out)
        record = {"documents": n, "seconds": took, "s_per_1000_documents": round(result["wall"] / n * 1000, 3),
                  "peak_pss_mb": peak, "peak_stage": at, "stage_peak_pss_mb": peaks,
                  "peak_anon_mb": anon_peak, "peak_anon_stage": anon_at, "stage_peak_anon_mb": anonymous,
                  "max_process_rss_mb": result["max_process_rss_mb"],
                  "peak_tree_rss_mb": round(max((r for _, r, *_ in result["samples"]), default=0) / 2**20),
                  "steps": step_seconds(result["lines"]), "test_accuracy": han, "baseline_test_accuracy": base,
                  "returncode": result["returncode"], "cores": cores, "epochs": args.epochs, "commit": commit.strip(),
                  "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
                  "at": time.strftime("%Y-%m-%d %H:%M"), "command": shlex.join(cmd)}
        with (args.dir / "results.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        if not args.keep_caches:  # several GB at 1,000,000 documents
            for cache in ("cache", "hf"):
                shutil.rmtree(out / cache, ignore_errors=True)
        cell = lambda v, w, f=".1f": f"{'-' if v is None else format(v, f):>{w}}"  # noqa: E731
        rows.append(f"{n:>10,} " + " ".join(cell(took[k], 8) for k in [*STAGES, "total"])
                    + f" {record['s_per_1000_documents']:>9.2f} {peak:>8,} {at:>8} {anon_peak:>8,} {anon_at:>8}"
                    + f" {result['max_process_rss_mb']:>7,}"
                    + f" {cell(han, 7, '.3f')} {cell(base, 8, '.3f')}"
                    + (f"  (exit {result['returncode']}: see {out / 'fit.log'})" if result["returncode"] else ""))
        print("\n".join(rows), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("build", "run"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, default=REPO / "runs" / "scale", help="where corpora and runs go")
        p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000], help="documents")
        if name == "build":
            p.add_argument("--seed", type=int, default=0)
            p.add_argument("--test-size", type=int, default=5_000, help="documents in scale-test.parquet")
        else:
            p.add_argument("--epochs", type=int, default=1, help="trainer.max_epochs")
            p.add_argument("--cores", default="0,1", help="cores to pin the fit to (taskset: 0,1 or 0-3), or none")
            p.add_argument("--fit-args", default="", help="more han-train arguments, as one string")
            p.add_argument("--keep-caches", action="store_true", help="keep the tokenisation and word2vec caches")
    args = parser.parse_args()
    build(args) if args.command == "build" else run(args)


if __name__ == "__main__":
    main()
