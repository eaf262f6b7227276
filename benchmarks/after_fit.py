"""What a fit does after training, two ways: the evaluation and then the faithfulness check (all the
torch threads, as before e894b81), against the check in a thread beside the evaluation on its own copy
of the model, half the threads each (training.export.ExportModel._measure). Rounds alternate the order.

    .venv/bin/python benchmarks/after_fit.py runs/imdb_quick/model --documents 8000 --checked 32 --tau 6 --rounds 4
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from han import Pipeline, SavedModel
from training.faithfulness_report import faithfulness_report
from training.report import evaluate

DEFAULT_TEST = Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets" / "imdb" / "test.parquet"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a model directory (an IMDB model: runs/imdb_quick/model)")
    parser.add_argument("--test", type=Path, default=DEFAULT_TEST, help="IMDB test.parquet")
    parser.add_argument("--documents", type=int, default=8000, help="test reviews evaluated")
    parser.add_argument("--checked", type=int, default=32, help="reviews the faithfulness check measures")
    parser.add_argument("--tau", type=int, default=6, help="of those, how many get the Kendall tau")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    saved = SavedModel.load(args.model)
    table = pq.read_table(args.test, columns=["text", "label"]).slice(0, args.documents).to_pydict()
    texts = table["text"]
    targets = np.array([saved.labels.index(str(label)) for label in table["label"]])
    out = Path("/tmp") / f"after_fit-{os.getpid()}"

    def check(model: SavedModel) -> None:
        faithfulness_report(Pipeline(model, batch_size=256), texts, args.checked, args.tau, out, "benchmark")

    threads = torch.get_num_threads()

    def in_turn() -> None:
        evaluate(Pipeline(saved, batch_size=256), texts, targets)
        check(saved)

    def beside() -> None:
        torch.set_num_threads(max(1, threads // 2))
        thread = threading.Thread(target=check, args=(copy.deepcopy(saved),))
        thread.start()
        evaluate(Pipeline(saved, batch_size=256), texts, targets)
        thread.join()
        torch.set_num_threads(threads)

    seconds: dict[str, list[float]] = {"in turn": [], "beside": []}
    for r in range(args.rounds):
        ways = [("in turn", in_turn), ("beside", beside)]
        for name, run in ways if r % 2 == 0 else ways[::-1]:
            start = time.monotonic()
            run()
            seconds[name].append(time.monotonic() - start)
            print(f"round {r + 1} {name:>7}: {seconds[name][-1]:6.1f} s   load {os.getloadavg()[0]:.2f}", flush=True)
    turn, side = statistics.median(seconds["in turn"]), statistics.median(seconds["beside"])
    print(f"median: in turn {turn:.1f} s, beside {side:.1f} s ({side / turn:.2f}x)")


if __name__ == "__main__":
    main()
