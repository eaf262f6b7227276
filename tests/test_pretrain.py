"""Pre-training the word encoder as two language models (training.pretrain), on the fixture reviews."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from han.model import HAN, HANConfig
from training.data import HANDataModule
from training.pretrain import pretrain_word_encoder

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "data" / "fixtures" / "reviews.jsonl"


def _setup(tmp_path: Path) -> tuple[HAN, HANDataModule]:
    data = HANDataModule(train=str(FIXTURE), cache_dir=str(tmp_path / "cache"), seed=0)
    data.setup()
    torch.manual_seed(0)
    net = HAN(HANConfig(vocab_size=data.vocab_size, num_labels=data.num_labels, embed_dim=16, word_hidden=8,
                        sentence_hidden=8))
    return net, data


def _weights(net: HAN) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in net.word_rnn.state_dict().items()}


def test_the_language_models_learn_the_text_and_the_encoder_is_cached(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    net, data = _setup(tmp_path)
    before, embedding = _weights(net), net.embedding.weight.clone()
    with caplog.at_level("INFO"):
        pretrain_word_encoder(net, data, 30, tmp_path / "cache")
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", caplog.text).groups())
    assert last < first - 0.5, caplog.text  # the next (and the previous) word predicted better
    assert torch.equal(net.embedding.weight, embedding), "the word vectors stay as they are"
    learned = _weights(net)
    assert any(not torch.equal(before[k], learned[k]) for k in learned)
    cached = list((tmp_path / "cache").glob("word-encoder-*.safetensors"))
    assert len(cached) == 1
    # a second fit over the same text: the cached encoder, the same weights, no training
    again, _ = _setup(tmp_path)
    caplog.clear()
    with caplog.at_level("INFO"):
        pretrain_word_encoder(again, data, 30, tmp_path / "cache")
    assert "reusing" in caplog.text and "sampled-softmax loss" not in caplog.text
    assert all(torch.equal(learned[k], v) for k, v in _weights(again).items())


def test_the_time_budget_ends_it_and_nothing_partial_is_cached(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    net, data = _setup(tmp_path)
    with caplog.at_level("INFO"):
        pretrain_word_encoder(net, data, 30, tmp_path / "cache", deadline=time.monotonic() - 1)
    assert "over 1 batches (stopped by the time budget)" in caplog.text
    assert not list((tmp_path / "cache").glob("word-encoder-*"))
