"""What the explanation benchmarks share: a trained model's pipeline on one torch thread, and the
reviews in one seeded order, so that their samples are the same reviews."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import TYPE_CHECKING

from han.environment import apply_defaults

if TYPE_CHECKING:
    from han import Pipeline

REPO = Path(__file__).resolve().parent.parent
IMDB_TEST = REPO.parent / "shared" / "datasets" / "imdb" / "test.parquet"


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default="han-imdb:latest", help="BentoML tag or model directory")
    parser.add_argument("--data", type=Path, default=IMDB_TEST, help="a Parquet file (default: IMDB's test split)")
    parser.add_argument("--text-column", default="text")


def pipeline_and_reviews(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Pipeline, list]:
    """The model's pipeline (batches of 64, one torch thread) and the ``--data`` texts shuffled with seed 0;
    a model that is not there is a usage error, not a traceback."""
    apply_defaults()
    import pyarrow.parquet as pq
    import torch

    import model_store
    from han import Pipeline

    torch.set_num_threads(1)
    try:
        pipeline = Pipeline(model_store.load(args.model), batch_size=64)
    except model_store.ModelNotFoundError as error:
        parser.error(str(error))
    texts = pq.read_table(args.data, columns=[args.text_column]).column(args.text_column).to_pylist()
    random.Random(0).shuffle(texts)
    return pipeline, texts
