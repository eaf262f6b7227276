"""Benchmark ``han-score``: documents/s end to end and peak memory, on the IMDB test reviews.

    .venv/bin/python benchmarks/batch_score.py                       # 5,000 and 25,000 rows, explanations off and on
    .venv/bin/python benchmarks/batch_score.py --model han-imdb:latest --rows 25000 --explain-modes off
    .venv/bin/python benchmarks/batch_score.py --engine ray --rows 25000 --repeat 3   # Ray vs local, in turn
    .venv/bin/python benchmarks/batch_score.py --stages 10000      # CPU ms per review of each stage

Each configuration runs ``han-score`` as a subprocess, exactly as a user would (Parquet in,
Parquet out, text column ``text``), and measures:

- wall time of the whole command (start-up, model load, reading, scoring, writing, merging)
  and documents/s over it ("end to end"); also the steady rate han-score reports once its
  first window is back (start-up excluded);
- peak RSS of the process tree: han-score plus its worker processes, sampled every 20 ms
  and summed (shared pages are counted once per process, so this over-states a little);
- CPU seconds used (user + system, all processes), and the load average around the run
  (other work on the machine slows every figure down).

Without ``--model`` it builds (once, cached in ``.cache/bench-imdb-random``) a model with the
real IMDB architecture (``HANConfig`` and ``SegmenterConfig`` defaults) and vocabulary
(``Vocabulary.build`` over IMDB train, ``min_freq=2, max_size=50000``) but random weights:
speed and memory do not depend on the weights.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from han.environment import apply_defaults

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "datasets" / "imdb"

ENV = apply_defaults(dict(os.environ))


def first_rows(source: Path, rows: int, dest: Path) -> Path:
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(source).slice(0, rows), dest)
    return dest


def measure(cmd: list[str], summary_path: Path, cwd: Path = REPO, env: dict[str, str] | None = None) -> dict:
    """Run ``cmd``, sampling the RSS of its process tree; returns its JSON summary plus wall, RSS and CPU."""
    load_before = os.getloadavg()[0]
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env or ENV)
    root = psutil.Process(proc.pid)
    tree: list[psutil.Process] = [root]
    peak_total = peak_main = 0
    last_scan = 0.0
    while proc.poll() is None:
        now = time.monotonic()
        if now - last_scan > 0.5:  # listing children is the costly part: not every sample
            with contextlib.suppress(psutil.Error):
                tree = [root, *root.children(recursive=True)]
            last_scan = now
        rss = []
        for p in tree:
            try:
                rss.append(p.memory_info().rss)
            except psutil.Error:
                rss.append(0)
        peak_total = max(peak_total, sum(rss))
        peak_main = max(peak_main, rss[0])
        time.sleep(0.05)
    wall = time.monotonic() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"failed with exit code {proc.returncode}: {' '.join(cmd)}")
    summary = json.loads(summary_path.read_text())
    return {
        "rows": summary["rows_read"],
        "wall_s": wall,
        "docs_per_s": summary["rows_read"] / wall,
        "steady_docs_per_s": summary.get("steady_docs_per_s"),
        "peak_rss_mb": peak_total / 2**20,
        "peak_rss_main_mb": peak_main / 2**20,
        "cpu_s": (usage.ru_utime - usage_before.ru_utime) + (usage.ru_stime - usage_before.ru_stime),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def run_once(
    input_path: Path, model: str, explain: bool, workdir: Path, extra: list[str], checkout: Path = REPO
) -> dict:
    """One han-score run, of this checkout or of another one (its own entry module, on its own path)."""
    summary_path = workdir / "summary.json"
    module = "service.batch" if (checkout / "service" / "batch.py").is_file() else "scoring"  # before/after 2026-11
    cmd = [sys.executable, "-m", module, str(input_path), str(workdir / "scores.parquet")]
    cmd += ["--model", model, "--overwrite", "--quiet", "--summary-json", str(summary_path)]
    cmd += [*(["--explain"] if explain else []), *extra]
    env = {**ENV, "PYTHONPATH": str(checkout)}
    return measure(cmd, summary_path, cwd=checkout, env=env)


def compare_checkouts(
    previous: Path, source: Path, model: str, explain: bool, rounds: int, workdir: Path, extra: list[str]
) -> None:
    """han-score of ``previous`` and of this checkout in turn, the order swapped every round (A B, B A,
    ...: a fixed order would put any drift within a round on one side): docs/s, and the ratio per round."""
    ratios = []
    for round_ in range(1, rounds + 1):
        order = [previous, REPO] if round_ % 2 else [REPO, previous]
        runs = [run_once(source, model, explain, workdir, extra, checkout=checkout) for checkout in order]
        old, new = runs if round_ % 2 else runs[::-1]
        ratios.append(new["docs_per_s"] / old["docs_per_s"])
        for name, r in (("previous", old), ("this", new)):
            print(
                f"round {round_}  {name:<8}  end-to-end {r['docs_per_s']:6.0f} docs/s  wall {r['wall_s']:6.1f} s  "
                f"peak RSS {r['peak_rss_mb']:6.0f} MiB  CPU {r['cpu_s']:6.1f} s  "
                f"load {r['load_before']:.1f}->{r['load_after']:.1f}",
                flush=True,
            )
    print(
        f"this / previous, end-to-end docs/s (explain {'on' if explain else 'off'}), per round: "
        + ", ".join(f"{r:.3f}" for r in ratios)
        + f"; median {statistics.median(ratios):.3f}"
    )


def split_pipeline(model: str, source: str, threads: int, summary_path: str) -> None:
    """The design han-score does not use, for comparison: one spawned process reads and segments
    (spaCy), this process encodes and runs the model (the pipeline's stages, windows of 500) with
    ``threads`` torch threads; segments cross a bounded queue."""
    import multiprocessing as mp

    from han import Pipeline, SavedModel
    from han.environment import tune_process

    tune_process(threads)
    pipeline = Pipeline(SavedModel.load(model))
    ctx = mp.get_context("spawn")
    segments = ctx.Queue(maxsize=8)
    tokeniser = ctx.Process(target=_tokenise, args=(model, source, segments), daemon=True)
    tokeniser.start()
    window: list = []
    first_at, scored, first_rows = None, 0, 0
    while True:
        batch = segments.get()
        if batch is not None:
            window += batch
        if len(window) >= 500 or (batch is None and window):
            for _ in pipeline.forward([pipeline.encode(segment) for segment in window]):
                pass
            scored += len(window)
            window = []
            if first_at is None:
                first_at, first_rows = time.monotonic(), scored
        if batch is None:
            break
    steady = (scored - first_rows) / (time.monotonic() - first_at) if first_at else None
    Path(summary_path).write_text(json.dumps({"rows_read": scored, "steady_docs_per_s": steady}))
    tokeniser.join()


def _tokenise(model: str, source: str, out: Any) -> None:
    import pyarrow.parquet as pq

    from han import SavedModel, Segmenter

    segmenter = Segmenter(SavedModel.load(model).segmenter)
    batch: list = []
    for batch_table in pq.ParquetFile(source).iter_batches(batch_size=1000, columns=["text"]):
        for segment in segmenter.segment_many(batch_table.column("text").to_pylist()):
            batch.append(segment)
            if len(batch) == 100:
                out.put(batch)
                batch = []
    if batch:
        out.put(batch)
    out.put(None)


def compare_designs(model: str, data: Path, rows: int, repeat: int, workdir: Path) -> None:
    """Steady docs/s of han-score's design (every process segments and scores whole windows) against
    one process per stage; interleaved, best of ``repeat``."""
    source = data if rows >= _num_rows(data) else first_rows(data, rows, workdir / f"first-{rows}.parquet")
    summary = workdir / "design.json"
    designs = {
        "han-score, 2 processes x 1 thread (default)": ["--workers", "2"],
        "han-score, 1 process x 1 thread": ["--workers", "1"],
        "split: tokeniser process -> model process, 1 thread": "split-1",
        "split: tokeniser process -> model process, 2 threads": "split-2",
    }
    best: dict[str, dict] = {}
    for _ in range(repeat):
        for name, how in designs.items():
            if isinstance(how, str):
                cmd = [sys.executable, __file__, "--split-pipeline", model, str(source), how[-1], str(summary)]
                result = measure(cmd, summary)
            else:
                result = run_once(source, model, False, workdir, how)
            if name not in best or (result["steady_docs_per_s"] or 0) > (best[name]["steady_docs_per_s"] or 0):
                best[name] = result
    for name, r in best.items():
        print(
            f"{name:54s} steady {r['steady_docs_per_s'] or 0:5.0f} docs/s  end-to-end {r['docs_per_s']:5.0f} docs/s  "
            f"CPU {r['cpu_s']:5.1f} s  peak RSS {r['peak_rss_mb']:5.0f} MiB  load {r['load_before']:.1f}",
            flush=True,
        )


def stage_costs(model: str, data: Path, rows: int, window: int = 500) -> None:
    """CPU ms per review of each pipeline stage, one process and one torch thread, over the first
    ``rows`` reviews in han-score's windows (a stream: spaCy's tokenizer cache starts cold). Run it
    with ``PYTHONPATH=<other checkout>`` to time that checkout's ``han`` the same way."""
    import pyarrow.parquet as pq

    import han
    from han import Pipeline, SavedModel

    try:
        from han.environment import tune_process
    except ImportError:  # before 2026-11-23
        from scoring.score import tune_process  # type: ignore[attr-defined,no-redef]
    tune_process(1)
    if not Path(model).exists():
        from model_store import model_path

        model = str(model_path(model))
    texts = pq.read_table(data, columns=["text"]).column("text").to_pylist()[:rows]
    pipeline = Pipeline(SavedModel.load(model))
    spent = dict.fromkeys(("segment", "encode", "forward"), 0.0)
    for start in range(0, len(texts), window):
        t0 = time.process_time()
        segments = pipeline.segment(texts[start : start + window])
        t1 = time.process_time()
        encoded = [pipeline.encode(segment) for segment in segments]
        t2 = time.process_time()
        for _ in pipeline.forward(encoded):
            pass
        t3 = time.process_time()
        for stage, seconds in zip(spent, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            spent[stage] += seconds
    tokenizer = pipeline.segmenter.nlp.tokenizer
    t0 = time.process_time()
    for _ in tokenizer.pipe(texts[: min(rows, 2000)]):  # warm cache: the floor
        pass
    floor = (time.process_time() - t0) / min(rows, 2000)
    figures = "  ".join(f"{stage} {1000 * seconds / len(texts):.2f}" for stage, seconds in spent.items())
    checkout = Path(han.__file__).parent.parent
    print(f"{checkout}: ms/review  {figures}  (spaCy's tokenizer alone, warm cache: {1000 * floor:.2f})")


def _num_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model tag or directory (default: build/reuse a random-weight IMDB model)")
    parser.add_argument("--data", type=Path, default=DATA / "test.parquet", help="Parquet file with a text column")
    parser.add_argument("--rows", type=int, nargs="+", default=[5_000, 25_000], help="input sizes (first N rows)")
    parser.add_argument("--explain-modes", nargs="+", choices=["off", "on"], default=["off", "on"])
    parser.add_argument(
        "--explain-rows", type=int, default=None, help="rows for the explain runs (default: the largest --rows)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration (the best is reported)")
    parser.add_argument(
        "--designs",
        type=int,
        metavar="ROWS",
        help="instead: compare process/thread layouts on the first ROWS rows (steady docs/s)",
    )
    parser.add_argument(
        "--compare-with",
        type=Path,
        metavar="CHECKOUT",
        help="instead: run another checkout's han-score (e.g. `git worktree add /tmp/prev HEAD~1`) and this one "
        "in turn on the first of --rows, --repeat rounds (explain per the first --explain-modes), with the ratio",
    )
    parser.add_argument("--engine", choices=["local", "ray"], default="local",
                        help="ray: the Ray engine against the local one on the first of --rows (benchmarks/engines.py)")
    parser.add_argument(
        "--stages",
        type=int,
        metavar="ROWS",
        help="instead: CPU ms per review of segment, encode and forward in one process over the first ROWS rows",
    )
    parser.add_argument("--split-pipeline", nargs=4, help=argparse.SUPPRESS)  # internal: one --designs run
    parser.add_argument("extra", nargs="*", help="extra han-score options after --, e.g. -- --workers 1")
    args = parser.parse_args()
    if args.split_pipeline:
        model, source, threads, summary = args.split_pipeline
        split_pipeline(model, source, int(threads), summary)
        return

    model = args.model
    if model is None:
        sys.path.insert(0, str(REPO))
        from benchmarks.bench_model import bench_model_dir

        model = str(bench_model_dir(args.data.parent / "train.parquet"))
    elif Path(model).exists():
        model = str(Path(model).resolve())  # another checkout runs in its own folder

    if args.stages:
        stage_costs(model, args.data, args.stages)
        return
    import pyarrow.parquet as pq

    total_rows = pq.ParquetFile(args.data).metadata.num_rows
    print(
        f"machine: {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB; python {sys.version.split()[0]}"
    )
    print(f"data: {args.data} ({total_rows:,} rows); model: {model}; han-score options: {args.extra or '-'}")
    if args.engine == "ray":
        sys.path.insert(0, str(REPO))
        from benchmarks.engines import compare_engines

        with tempfile.TemporaryDirectory(prefix="han-bench-") as tmp:
            compare_engines(measure, args.data, model, args.rows[0], Path(tmp), args.extra, args.repeat)
        return
    if args.designs:
        with tempfile.TemporaryDirectory(prefix="han-bench-") as tmp:
            compare_designs(model, args.data, args.designs, args.repeat, Path(tmp))
        return
    if args.compare_with:
        with tempfile.TemporaryDirectory(prefix="han-bench-") as tmp:
            rows = args.rows[0]
            source = (
                args.data if rows >= total_rows else first_rows(args.data, rows, Path(tmp) / f"first-{rows}.parquet")
            )
            compare_checkouts(
                args.compare_with.resolve(),
                source,
                model,
                args.explain_modes[0] == "on",
                args.repeat,
                Path(tmp),
                args.extra,
            )
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="han-bench-") as tmp:
        workdir = Path(tmp)
        configs = [(rows, False) for rows in args.rows] if "off" in args.explain_modes else []
        if "on" in args.explain_modes:
            configs.append((args.explain_rows or max(args.rows), True))
        for rows, explain in configs:
            source = args.data if rows >= total_rows else first_rows(args.data, rows, workdir / f"first-{rows}.parquet")
            runs = [run_once(source, model, explain, workdir, args.extra) for _ in range(args.repeat)]
            best = max(runs, key=lambda r: r["docs_per_s"])
            best["explain"] = explain
            results.append(best)
            print(
                f"rows {best['rows']:>6,}  explain {'on ' if explain else 'off'}  wall {best['wall_s']:6.1f} s  "
                f"end-to-end {best['docs_per_s']:6.0f} docs/s  steady {best['steady_docs_per_s'] or 0:6.0f} docs/s  "
                f"peak RSS {best['peak_rss_mb']:6.0f} MiB (main {best['peak_rss_main_mb']:.0f})  "
                f"CPU {best['cpu_s']:6.1f} s  load {best['load_before']:.1f}->{best['load_after']:.1f}",
                flush=True,
            )
    plain = {r["rows"]: r for r in results if not r["explain"]}
    if len(plain) >= 2:
        small, large = plain[min(plain)], plain[max(plain)]
        growth = large["peak_rss_mb"] / small["peak_rss_mb"] - 1
        print(f"peak RSS at {large['rows']:,} rows vs {small['rows']:,} rows: {growth:+.1%}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
