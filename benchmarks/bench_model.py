"""The one random-weight benchmark model: the default architecture, the IMDB-train vocabulary, random
weights. Speed depends on the sizes and the vocabulary, not on what the weights learned, so the
serving and batch-scoring benchmarks need no trained model. Built once and kept in .cache/."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "bench-imdb-random"
DATA = REPO.parent / "shared" / "datasets" / "imdb"


def bench_model_dir(train: Path = DATA / "train.parquet", directory: Path = CACHE) -> Path:
    """The model directory, built (about 30 s: it segments IMDB train) unless a loadable one exists."""
    from han import HAN, HANConfig, ModelDirectoryError, SavedModel, Segmenter, SegmenterConfig, Vocabulary

    try:
        SavedModel.load(directory)
        return directory
    except ModelDirectoryError:
        pass
    import pyarrow.parquet as pq
    import torch

    print(f"building the random-weight IMDB model in {directory} (segments {train} once) ...", flush=True)
    texts = pq.read_table(train, columns=["text"]).column("text").to_pylist()
    segmenter_config = SegmenterConfig()
    vocab = Vocabulary.build((s.token_keys for s in Segmenter(segmenter_config).segment_many(texts)), max_size=50_000)
    torch.manual_seed(0)
    model = HAN(HANConfig(vocab_size=len(vocab), num_labels=2)).eval()
    metadata = {"dataset": "imdb", "weights": "random (benchmark only)"}
    return SavedModel(model, vocab, ["neg", "pos"], segmenter_config, metadata=metadata).save(directory)


def register_bench_model(name: str = "han-bench") -> str:
    """The benchmark model in the BentoML model store (registered once); returns its tag."""
    import bentoml

    from han import SavedModel
    from model_store import register

    try:
        return str(bentoml.models.get(f"{name}:latest").tag)
    except bentoml.exceptions.NotFound:
        return register(SavedModel.load(bench_model_dir()), name, {"note": "benchmark stand-in: random weights"})
