"""Train a tiny HAN on the handwritten fixtures in plain PyTorch (seconds), for tests that need a model."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from han import HAN, HANConfig, SavedModel, Segmenter, SegmenterConfig, Vocabulary, collate

FIXTURES = Path(__file__).resolve().parent.parent / "data" / "fixtures"


def read_jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines() if line]


def train_tiny_model(
    steps: int = 60, multi_label: bool = False, seed: int = 0, sentence_values: str = "contextual"
) -> tuple[SavedModel, list[float]]:
    """Fit a small HAN on data/fixtures (reviews, or topics if multi_label); returns it and the losses."""
    torch.manual_seed(seed)
    rows = read_jsonl("topics.jsonl" if multi_label else "reviews.jsonl")
    seg_config = SegmenterConfig(max_sentences=8, max_words=20)
    segments = list(Segmenter(seg_config).segment_many(r["text"] for r in rows))
    vocab = Vocabulary.build((s.token_keys for s in segments), min_freq=1)
    if multi_label:
        labels = sorted({label for r in rows for label in r["labels"]})
        target = torch.tensor([[float(lab in r["labels"]) for lab in labels] for r in rows])
        loss_fn = torch.nn.BCEWithLogitsLoss()
    else:
        labels = sorted({r["label"] for r in rows})
        target = torch.tensor([labels.index(r["label"]) for r in rows])
        loss_fn = torch.nn.CrossEntropyLoss()
    config = HANConfig(
        vocab_size=len(vocab), num_labels=len(labels), multi_label=multi_label,
        embed_dim=16, word_hidden=12, sentence_hidden=12, attention_dim=16, dropout=0.0, word_dropout=0.0,
        sentence_values=sentence_values,
    )
    model = HAN(config)
    batch = collate([[vocab.encode(k) for k in s.token_keys] for s in segments])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.03)
    losses = []
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(*batch).logits, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return SavedModel(model, vocab, labels, seg_config, metadata={"dataset": "fixture"}), losses


def with_ngram_head(saved: SavedModel, han_share: float) -> SavedModel:
    """``saved`` with an n-gram head (han.ngrams) learned from the fixture reviews, at ``han_share``."""
    import numpy as np

    from training.baseline import train_baseline
    from training.ngram_head import head_from_baseline

    rows = read_jsonl("reviews.jsonl")
    targets = np.array([saved.labels.index(r["label"]) for r in rows])
    baseline = train_baseline([r["text"] for r in rows], targets, multi_label=False)
    saved.ngrams = head_from_baseline(baseline, len(saved.labels), han_share)
    return saved


def worse_model(saved: SavedModel) -> SavedModel:
    """``saved`` made deliberately worse: its label head negated, so it prefers the labels it ranked last."""
    with torch.no_grad():
        saved.model.head.weight.neg_()
        saved.model.head.bias.neg_()
    saved.metadata = {**saved.metadata, "dataset": "fixture, head negated"}
    return saved
