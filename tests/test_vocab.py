"""Vocabulary: frequency cut-offs, size cap, padding/unknown ids, JSON round trip."""

from __future__ import annotations

import pytest

from han.vocab import PAD, UNK, Vocabulary

DOCS = [[["the", "film", "was", "good"], ["the", "end"]], [["the", "film", "was", "bad"]]]


def test_build_keeps_frequent_tokens_most_frequent_first() -> None:
    vocab = Vocabulary.build(DOCS, min_freq=2)
    assert vocab.itos == [PAD, UNK, "the", "film", "was"]
    assert vocab.encode(["the", "good", "was"]) == [2, vocab.unk_id, 4]
    assert vocab.pad_id == 0 and vocab.unk_id == 1


def test_max_size_counts_the_special_tokens() -> None:
    vocab = Vocabulary.build(DOCS, min_freq=1, max_size=4)
    assert len(vocab) == 4 and vocab.itos[2:] == ["the", "film"]


def test_save_and_load_round_trip(tmp_path) -> None:
    vocab = Vocabulary.build(DOCS, min_freq=1)
    vocab.save(tmp_path / "vocab.json")
    assert Vocabulary.load(tmp_path / "vocab.json").itos == vocab.itos


def test_load_rejects_a_file_that_is_not_a_vocabulary(tmp_path) -> None:
    path = tmp_path / "vocab.json"
    path.write_text('{"tokens": ["a", "b"]}')
    with pytest.raises(ValueError, match="not a vocabulary"):
        Vocabulary.load(path)
