"""Pretrained word vectors for the embedding table: word2vec (text and binary), GloVe, fastText, gensim.

    word2vec text, fastText .vec   a header line "<count> <dim>", then "<word> <dim numbers>" per line
    GloVe .txt                      the same lines, no header
    word2vec binary (.bin)          the header line, then per word "<word> " and <dim> little-endian float32
    gensim KeyedVectors (.kv)       gensim's own format (``KeyedVectors.save``); it is pickle-based, so
                                    load only files you trust. Needs gensim.

Text files may be gzip-compressed (``.gz``). Only the rows of words in the vocabulary are kept, so a
multi-GB file loads in one pass with little memory. A word is matched exactly, else lower-cased (the
vocabulary's keys are lower case: ``Paris`` in GloVe serves ``paris``; an exact entry wins). Rows
without a vector start random at the scale of the loaded ones. A bad or truncated file raises
``VectorsError`` naming the file and the line (or, binary, the entry). ``vectors_dimension`` reads
only the header or the first line, so the model can take the file's dimension before loading it.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from han.segment import token_key
from han.vocab import Vocabulary


class VectorsError(ValueError):
    """A vectors file that cannot be read, or does not fit the model (one line, naming the file)."""


@dataclass
class Vectors:
    """Vectors matched to a vocabulary: row i is word i's vector (random where ``found[i]`` is False)."""

    matrix: np.ndarray  # [len(vocab), dim] float32
    found: np.ndarray  # [len(vocab)] bool
    source: str

    def coverage(self, token_counts: np.ndarray | None = None) -> str:
        """'vectors for 94.1% of the vocabulary, 99.2% of training tokens' (padding and <unk> left out)."""
        found = self.found[2:]
        text = f"vectors for {100 * found.mean():.1f}% of the vocabulary"
        if token_counts is not None and token_counts[2:].sum() > 0:
            text += f", {100 * (token_counts[2:] * found).sum() / token_counts[2:].sum():.1f}% of training tokens"
        return text


def load_vectors(path: str | Path, vocab: Vocabulary, dim: int | None = None, seed: int = 0) -> Vectors:
    """Read ``path`` (format from its name, see above) and match it to ``vocab``. ``dim``, if given, must
    be the file's dimension (the model's ``embed_dim``)."""
    path = _existing(path)
    entries, file_dim = _reader(path)(path)
    if dim is not None and file_dim != dim:
        raise VectorsError(f"{path}: the vectors have {file_dim} dimensions but model.embed_dim is {dim} "
                           f"(set --model.embed_dim {file_dim})")
    return match(entries, vocab, file_dim, str(path), seed)


def vectors_dimension(path: str | Path) -> int:
    """The file's dimension from its header or first line (gensim: its metadata), without reading the
    vectors: the model's ``embed_dim`` is known before the data, and the file is read once, in full, later."""
    path = _existing(path)
    reader = _reader(path)
    if reader is _text:
        return _text_header(path)[1]
    if reader is _word2vec_binary:
        return _binary_header(path)[1]
    return _gensim(path)[1]  # memory-maps the vectors: reads the word list only


def _existing(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise VectorsError(f"{path}: vectors file not found")
    return path


def _reader(path: Path) -> Callable[[Path], tuple[Iterator[tuple[str, np.ndarray]], int]]:
    """The format's reader, from the file's name."""
    name = path.name.lower()
    if name.endswith((".kv", ".model", ".wv")):
        return _gensim
    return _word2vec_binary if name.endswith(".bin") else _text


def match(entries: Iterator[tuple[str, np.ndarray]], vocab: Vocabulary, dim: int, source: str, seed: int = 0
          ) -> Vectors:
    """Rows for the vocabulary's words from (word, vector) pairs: exact match first, else the word's key."""
    matrix = np.zeros((len(vocab), dim), dtype=np.float32)
    exact = np.zeros(len(vocab), dtype=bool)
    found = np.zeros(len(vocab), dtype=bool)
    stoi = vocab.stoi
    for word, vector in entries:
        i = stoi.get(word)
        if i is not None:
            matrix[i], exact[i], found[i] = vector, True, True
            continue
        i = stoi.get(token_key(word))  # lower case, NFC: as the vocabulary's keys (Ä in NFD serves ä)
        if i is not None and not exact[i] and not found[i]:
            matrix[i], found[i] = vector, True
    found[: Vocabulary.unk_id + 1] = False  # padding stays zero; <unk> is learned
    scale = float(matrix[found].std()) if found.any() else 0.1
    rng = np.random.default_rng(seed)
    missing = ~found
    matrix[missing] = rng.normal(0.0, scale, size=(int(missing.sum()), dim)).astype(np.float32)
    matrix[Vocabulary.pad_id] = 0.0
    return Vectors(matrix, found, source)


def _open_text(path: Path) -> IO[str]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    return opener(path, "rt", encoding="utf-8", errors="replace")  # type: ignore[operator]


def _text_header(path: Path) -> tuple[bool, int]:
    """(whether line 1 is a '<count> <dim>' header, the dimension): from the header, else from line 1."""
    with _open_text(path) as f:
        first = f.readline().rstrip("\n").rstrip(" ").split(" ")
    if not first or first == [""]:
        raise VectorsError(f"{path} line 1: empty file")
    header = len(first) == 2 and all(p.isdigit() for p in first)
    dim = int(first[1]) if header else len(first) - 1
    if dim < 1:
        raise VectorsError(f"{path} line 1: expected a word and its numbers, or a '<count> <dim>' header")
    return header, dim


def _text(path: Path) -> tuple[Iterator[tuple[str, np.ndarray]], int]:
    """word2vec text, fastText .vec or GloVe: the dimension from the header, else from the first line."""
    header, dim = _text_header(path)

    def entries() -> Iterator[tuple[str, np.ndarray]]:
        with _open_text(path) as f:
            if header:
                f.readline()
            for number, line in enumerate(f, start=2 if header else 1):
                parts = line.rstrip("\n").rstrip(" ").split(" ")
                if parts == [""]:
                    continue
                if len(parts) != dim + 1:
                    raise VectorsError(f"{path} line {number}: expected a word and {dim} numbers, "
                                       f"found {len(parts) - 1} numbers (a truncated or mixed file?)")
                try:
                    vector = np.asarray(parts[1:], dtype=np.float32)
                except ValueError:
                    raise VectorsError(f"{path} line {number}: not a number among the values of {parts[0]!r}") from None
                yield parts[0], vector

    return entries(), dim


def _binary_header(path: Path) -> tuple[int, int]:
    """(count, dim) from a word2vec binary file's first line."""
    with open(path, "rb") as f:
        header = f.readline().split()
    if len(header) != 2 or not all(p.isdigit() for p in header) or int(header[1]) < 1:
        raise VectorsError(f"{path} line 1: not a word2vec binary file (expected a '<count> <dim>' header)")
    return int(header[0]), int(header[1])


def _word2vec_binary(path: Path) -> tuple[Iterator[tuple[str, np.ndarray]], int]:
    count, dim = _binary_header(path)

    def entries() -> Iterator[tuple[str, np.ndarray]]:
        with open(path, "rb") as f:
            f.readline()
            for k in range(count):
                word = bytearray()
                while (byte := f.read(1)) != b" ":
                    if not byte:
                        raise VectorsError(f"{path}: ends at entry {k + 1} of {count} (a truncated file?)")
                    if byte != b"\n":
                        word += byte
                data = f.read(4 * dim)
                if len(data) < 4 * dim:
                    raise VectorsError(f"{path}: ends inside the vector of entry {k + 1} of {count} "
                                       f"({word.decode('utf-8', 'replace')!r}; a truncated file?)")
                yield word.decode("utf-8", "replace"), np.frombuffer(data, dtype="<f4")

    return entries(), dim


def _gensim(path: Path) -> tuple[Iterator[tuple[str, np.ndarray]], int]:
    try:
        from gensim.models import KeyedVectors
    except ImportError:
        raise VectorsError(f"{path}: gensim's KeyedVectors format needs gensim (pip install gensim)") from None
    try:
        kv = KeyedVectors.load(str(path), mmap="r")
    except Exception as e:  # gensim raises many types for a file that is not its own
        raise VectorsError(f"{path}: not a gensim KeyedVectors file ({type(e).__name__}: {e})") from None
    return ((word, kv.vectors[i]) for i, word in enumerate(kv.index_to_key)), int(kv.vector_size)
