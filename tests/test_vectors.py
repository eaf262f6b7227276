"""Pretrained word vectors: every standard file format, matching to the vocabulary, clear errors,
and word2vec built from the training text (and unlabelled text), cached."""

from __future__ import annotations

import gzip
import json
import logging
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from han import SavedModel, Vocabulary
from han.vectors import VectorsError, load_vectors
from tests.conftest import REPO
from training.cli import main

VOCAB = Vocabulary(["the", "film", "paris", "superb", "unseen"])
FILE_WORDS = {
    "the": [0.1, 0.2, 0.3],
    "film": [1.0, -1.0, 0.5],
    "Paris": [2.0, 2.0, 2.0],
    "paris": [3.0, 3.0, 3.0],
    "Superb": [-0.5, 0.25, 4.0],
    "elsewhere": [9.0, 9.0, 9.0],
}
SMOKE = str(REPO / "data" / "configs" / "smoke.yaml")


def text_lines(header: bool) -> str:
    lines = [f"{len(FILE_WORDS)} 3"] if header else []
    lines += [" ".join([word, *map(str, vector)]) for word, vector in FILE_WORDS.items()]
    return "\n".join(lines) + "\n"


def write(tmp_path: Path, fmt: str) -> Path:
    if fmt == "word2vec text":
        (path := tmp_path / "vectors.txt").write_text(text_lines(header=True))
    elif fmt == "glove":
        (path := tmp_path / "glove.6B.3d.txt").write_text(text_lines(header=False))
    elif fmt == "fasttext":
        (path := tmp_path / "wiki.en.vec").write_text(text_lines(header=True))
    elif fmt == "gzip":
        path = tmp_path / "vectors.txt.gz"
        with gzip.open(path, "wt") as f:
            f.write(text_lines(header=False))
    elif fmt == "word2vec binary":
        path = tmp_path / "vectors.bin"
        data = f"{len(FILE_WORDS)} 3\n".encode()
        for word, vector in FILE_WORDS.items():
            data += word.encode() + b" " + struct.pack("<3f", *vector) + b"\n"
        path.write_bytes(data)
    else:
        from gensim.models import KeyedVectors

        kv = KeyedVectors(3)
        kv.add_vectors(list(FILE_WORDS), np.array(list(FILE_WORDS.values()), dtype=np.float32))
        kv.save(str(path := tmp_path / "vectors.kv"))
    return path


@pytest.mark.parametrize("fmt", ["word2vec text", "glove", "fasttext", "gzip", "word2vec binary", "gensim"])
def test_each_format_loads_into_the_right_rows(tmp_path: Path, fmt: str) -> None:
    vectors = load_vectors(write(tmp_path, fmt), VOCAB, dim=3)
    row = VOCAB.stoi
    assert vectors.matrix.shape == (len(VOCAB), 3) and vectors.matrix.dtype == np.float32
    np.testing.assert_allclose(vectors.matrix[row["the"]], [0.1, 0.2, 0.3], rtol=1e-6)
    np.testing.assert_allclose(vectors.matrix[row["film"]], [1.0, -1.0, 0.5])
    np.testing.assert_allclose(vectors.matrix[row["paris"]], [3.0, 3.0, 3.0])  # the exact entry wins over "Paris"
    np.testing.assert_allclose(vectors.matrix[row["superb"]], [-0.5, 0.25, 4.0])  # lower-cased fallback
    assert list(vectors.found) == [False, False, True, True, True, True, False]
    np.testing.assert_array_equal(vectors.matrix[0], 0)  # padding
    assert np.abs(vectors.matrix[row["unseen"]]).sum() > 0  # random, at the vectors' scale
    counts = np.array([0, 10, 50, 20, 5, 5, 20])
    assert vectors.coverage(counts) == "vectors for 80.0% of the vocabulary, 80.0% of training tokens"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("2 3\nthe 0.1 0.2 0.3\nfilm 1.0 -1.0\n", r"vectors\.txt line 3: expected a word and 3 numbers, found 2"),
        ("the 0.1 0.2 0.3\nfilm 1.0 x 0.5\n", r"vectors\.txt line 2: not a number among the values of 'film'"),
        ("", r"vectors\.txt line 1: empty file"),
    ],
)
def test_a_bad_text_file_names_the_file_and_the_line(tmp_path: Path, content: str, message: str) -> None:
    (path := tmp_path / "vectors.txt").write_text(content)
    with pytest.raises(VectorsError, match=message):
        load_vectors(path, VOCAB, dim=3)


def test_a_truncated_binary_file_and_a_dimension_mismatch_are_named(tmp_path: Path) -> None:
    path = write(tmp_path, "word2vec binary")
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(VectorsError, match=r"vectors\.bin: ends inside the vector of entry 6 of 6 \('elsewhere'"):
        load_vectors(path, VOCAB, dim=3)
    with pytest.raises(
        VectorsError,
        match=r"glove\.6B\.3d\.txt: the vectors have 3 dimensions but model.embed_dim "
        r"is 16 \(set --model.embed_dim 3\)",
    ):
        load_vectors(write(tmp_path, "glove"), VOCAB, dim=16)


def fit(tmp_path: Path, *overrides: str) -> Path:
    root = tmp_path / "run"
    main(
        [
            "fit",
            "--config",
            SMOKE,
            "--trainer.default_root_dir",
            str(root),
            "--data.cache_dir",
            str(tmp_path / "cache"),
            "--trainer.max_epochs",
            "1",
            "--export.faithfulness",
            "0",
            *overrides,
        ]
    )
    return root


def test_a_vectors_file_initialises_the_model_and_its_coverage_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    vocab_words = ["wonderful", "film", "boring", "the"]
    (path := tmp_path / "mine.txt").write_text("".join(f"{w} {' '.join(['0.5'] * 16)}\n" for w in vocab_words))
    with caplog.at_level(logging.INFO):
        fit(tmp_path, "--model.embeddings", str(path), "--model.freeze_embeddings", "1")
    assert re.search(r"mine\.txt: vectors for \d+\.\d% of the vocabulary, \d+\.\d% of training tokens", caplog.text)
    saved = SavedModel.load(tmp_path / "run" / "model")
    for word in vocab_words:  # frozen for the one epoch: exactly the file's vectors
        np.testing.assert_allclose(saved.model.embedding.weight[saved.vocab.stoi[word]].detach().numpy(), 0.5)


def test_a_bad_vectors_file_stops_han_train_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (path := tmp_path / "broken.vec").write_text("2 16\nfilm 0.1\n")
    with pytest.raises(SystemExit):
        fit(tmp_path, "--model.embeddings", str(path))
    err = capsys.readouterr().err
    assert "broken.vec line 2: expected a word and 16 numbers, found 1" in err and "Traceback" not in err


def test_unlabelled_text_changes_the_built_vectors_and_a_rerun_hits_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fit(tmp_path, "--model.embeddings", "word2vec")
    first = sorted(cache.glob("word2vec-*.npy"))
    assert len(first) == 1
    stamp = first[0].stat().st_mtime_ns
    fit(tmp_path, "--model.embeddings", "word2vec")
    assert sorted(cache.glob("word2vec-*.npy")) == first and first[0].stat().st_mtime_ns == stamp, "reused"
    fit(
        tmp_path, "--model.embeddings", "word2vec", "--data.unlabeled", str(REPO / "data" / "fixtures" / "topics.jsonl")
    )
    built = sorted(cache.glob("word2vec-*.npy"))
    assert len(built) == 2
    (other,) = [p for p in built if p != first[0]]
    words = [json.loads(p.with_suffix(".json").read_text()) for p in (first[0], other)]
    assert "oil" in words[1] and "oil" not in words[0]  # words only the unlabelled text has


def test_more_word2vec_passes_build_other_vectors_and_a_bad_count_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    fit(tmp_path, "--model.embeddings", "word2vec")
    fit(tmp_path, "--model.embeddings", "word2vec", "--model.word2vec_epochs", "12")
    built = sorted(cache.glob("word2vec-*.npy"))
    assert len(built) == 2, "the passes are part of the cache key"
    a, b = (np.load(p) for p in built)
    assert a.shape == b.shape and not np.allclose(a, b)
    with pytest.raises(SystemExit):
        fit(tmp_path, "--model.word2vec_epochs", "0")
    err = capsys.readouterr().err
    assert "model.word2vec_epochs must be at least 1, not 0" in err and "Traceback" not in err
