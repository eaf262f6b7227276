"""How a workload slows down beside busy neighbours: its wall time alone, beside one and beside two
single-threaded CPU-bound processes (``python -c 'while 1: pass'``), in rounds, side by side.

    python benchmarks/contention.py training          # 60 IMDB training batches, 1 and 2 torch threads
    python benchmarks/contention.py fit               # a real han-train epoch of 150 batches (imdb_quick.yaml)
    python benchmarks/contention.py han-score         # han-score on 4,000 IMDB test reviews
    python benchmarks/contention.py service           # 32 clients against the service (serve_load)
    python benchmarks/contention.py all --rounds 2

Prints each variant's median wall time per condition and its slowdown (time beside N / time alone),
with the load average before. Run it on an otherwise quiet machine: it makes its own neighbours.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.served import exit_on_signals  # noqa: E402

BIN = Path(sys.executable).parent
BUSY = [sys.executable, "-c", "while 1: pass"]


def workloads(tmp: Path) -> dict[str, dict[str, list[str]]]:
    """Each workload's variants: name -> command."""
    python = sys.executable
    train = [python, "benchmarks/train_speed.py", "--config", "data/configs/imdb_quick.yaml", "--batches", "60",
             "--rounds", "1", "--only-shipped"]
    reviews = tmp / "reviews.parquet"
    if not reviews.is_file():
        import pyarrow.parquet as pq

        table = pq.read_table(REPO.parent / "shared" / "datasets" / "imdb" / "test.parquet", columns=["text"])
        pq.write_table(table.slice(0, 4000), reviews)
    score = [str(BIN / "han-score"), str(reviews), str(tmp / "scored.parquet"), "--overwrite", "--quiet",
             "--model", os.environ.get("HAN_MODEL_TAG", "han-imdb:latest")]
    fit = [str(BIN / "han-train"), "fit", "--config", "data/configs/imdb_quick.yaml", "--trainer.max_epochs", "1",
           "--trainer.limit_train_batches", "150", "--trainer.limit_val_batches", "0", "--data.test", "null",
           "--export.baseline", "false", "--export.faithfulness", "0", "--export.register", "false",
           "--trainer.default_root_dir", str(tmp / "fit"), "--trainer.enable_progress_bar", "false"]
    serve = [python, "benchmarks/serve_load.py", "--make-bench-model", "--requests", "1500", "--single", "50"]
    return {
        "training": {"1 thread": [*train, "--threads", "1"], "2 threads": [*train, "--threads", "2"]},
        "fit": {"threads follow free cores (default)": fit, "2 threads (OMP_NUM_THREADS=2)": ["env",
                "OMP_NUM_THREADS=2", *fit]},
        "han-score": {"default": score},
        "service": {"default": serve},
    }


def timed(command: list[str], neighbours: int) -> float:
    """Seconds of ``command`` with ``neighbours`` busy loops running beside it: the wall time, or the
    time the measured part took where the command reports it (train_speed.py's steps, a fit's first
    epoch, serve_load.py's concurrent run), start-up left out."""
    busy: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(neighbours):
            busy.append(subprocess.Popen(BUSY))
        time.sleep(0.5 if busy else 0)
        start = time.perf_counter()
        done = run_workload(command)
        wall = time.perf_counter() - start
        steps = re.search(r"\((\d+) documents.*\n.*?([\d.]+) docs/s", done.stdout)
        epoch = re.search(r"^epoch 0: ([\d.]+) s", done.stdout + done.stderr, re.MULTILINE)
        load = re.search(r"^\d+ clients\s+(\d+)\s+\d+\s+([\d.]+)", done.stdout, re.MULTILINE)  # serve_load
        for found in (steps, load):
            if found:
                return int(found.group(1)) / float(found.group(2))
        return float(epoch.group(1)) if epoch else wall
    finally:
        for process in busy:
            process.kill()
            process.wait()


def run_workload(command: list[str]) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, check=True)``, its output captured; stopped early (an error, a signal), the
    workload gets a SIGTERM and time to clean up (serve_load.py stops its server) before a SIGKILL."""
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            stdout, stderr = process.communicate()
        except BaseException:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
            raise
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command, stdout, stderr)
    return subprocess.CompletedProcess(command, 0, stdout, stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=["training", "fit", "han-score", "service", "all"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--neighbours", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    exit_on_signals()  # a SIGTERM too ends the busy neighbours and the workload (the `finally` block)
    tmp = Path(tempfile.gettempdir()) / "han-contention"
    tmp.mkdir(exist_ok=True)
    chosen = workloads(tmp)
    names = list(chosen) if args.workload == "all" else [args.workload]
    print(f"{os.cpu_count()} cores; load average before {os.getloadavg()[0]:.2f}; {args.rounds} rounds", flush=True)
    for name in names:
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):  # rounds interleave every variant and condition
            for variant, command in chosen[name].items():
                for n in args.neighbours:
                    times.setdefault((variant, n), []).append(timed(command, n))
        print(f"\n{name}\n| variant | " + " | ".join(f"beside {n} (s)" for n in args.neighbours)
              + " | " + " | ".join(f"slowdown beside {n}" for n in args.neighbours if n) + " |")
        print("| --- |" + " ---: |" * (2 * len(args.neighbours) - 1))
        for variant in chosen[name]:
            medians = {n: statistics.median(times[(variant, n)]) for n in args.neighbours}
            base = medians[args.neighbours[0]]
            print(f"| {variant} | " + " | ".join(f"{medians[n]:.1f}" for n in args.neighbours) + " | "
                  + " | ".join(f"{medians[n] / base:.2f}x" for n in args.neighbours if n) + " |", flush=True)
    print(f"\nload average after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
