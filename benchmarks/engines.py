"""``benchmarks/batch_score.py --engine ray``: han-score's Ray engine against its local engine, same run.

Both run as subprocesses on the same input (the first N IMDB test reviews plus a ``doc_id`` column,
which the Ray engine needs), one after the other, measured the same way (``batch_score.measure``:
wall time, docs/s end to end, peak RSS of the process tree). The Ray figures include starting
local Ray (its raylet, GCS and worker processes count towards its RSS) on ``--num-cpus`` cores.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def with_ids(source: Path, rows: int, dest: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(source, columns=["text"]).slice(0, rows)
    pq.write_table(table.append_column("doc_id", pa.array(range(len(table)), pa.int64())), dest)
    return dest


def compare_engines(
    measure: Any, source: Path, model: str, rows: int, workdir: Path, extra: list[str], repeat: int = 1
) -> list[dict]:
    """Local engine, then Ray engine, on the same first ``rows`` rows, ``repeat`` rounds in turn (the
    machine's speed drifts, so each round's ratio is taken side by side); one line per run, the ratios."""
    import statistics

    from han.environment import usable_cores

    data = with_ids(source, rows, workdir / f"ids-{rows}.parquet")
    cpus = str(usable_cores())
    results, ratios = [], []
    for round_ in range(1, repeat + 1):
        pair = {}
        for engine in ("local", "ray"):
            summary = workdir / f"{engine}.json"
            out = workdir / f"{engine}-scores.parquet"
            cmd = [sys.executable, "-m", "scoring", str(data), str(out), "--model", model, "--id-column", "doc_id",
                   "--quiet", "--overwrite", "--summary-json", str(summary), *extra]
            cmd += ["--engine", "ray", "--num-cpus", cpus] if engine == "ray" else []
            r = measure(cmd, summary)
            r.update(engine=engine, round=round_)
            results.append(r)
            pair[engine] = r["docs_per_s"]
            print(f"round {round_}, {engine:>5}: {rows:,} rows, {r['wall_s']:.1f} s, {r['docs_per_s']:.1f} docs/s "
                  f"end to end, peak RSS {r['peak_rss_mb']:.0f} MiB, load {r['load_before']:.2f}", flush=True)
        if pair["local"]:
            ratios.append(pair["ray"] / pair["local"])
    if ratios:
        print(f"ray / local docs/s per round: {', '.join(f'{x:.2f}x' for x in ratios)}; "
              f"median {statistics.median(ratios):.2f}x (the issue asks for >= 0.8x)")
    return results
