"""Word vectors for the embedding table: a file the user has, or word2vec built here from the data.

``--model.embeddings PATH`` loads a vectors file (``han.vectors``: word2vec, GloVe, fastText, gensim).
``--model.embeddings word2vec`` trains word2vec with gensim on the training split's sentences plus
any unlabelled text (``--data.unlabeled``), as Yang et al. did before training the HAN. The result
is cached beside the tokenisation cache (a .npy matrix and a JSON word list, no pickle), keyed by
the data's caches and the settings, so a second run reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pytorch_lightning.utilities import rank_zero_info

from han.vectors import Vectors, load_vectors, match

BUILD = "word2vec"
WORD2VEC = {"window": 5, "min_count": 2, "sg": 1, "negative": 5, "epochs": 5, "sample": 1e-4}  # skip-gram
VERSION = 1  # bump when the build changes, to invalidate caches


def word_vectors(spec: str, data: Any, dim: int, seed: int, epochs: int = WORD2VEC["epochs"]) -> Vectors:
    """The vectors ``spec`` names (a file, or ``word2vec``, built in ``epochs`` passes), matched to the
    data's vocabulary."""
    if spec == BUILD:
        return built_word2vec(data, dim, seed, epochs)
    return load_vectors(spec, data.vocab, dim=dim, seed=seed)


def built_word2vec(data: Any, dim: int, seed: int, epochs: int) -> Vectors:
    """word2vec on the data's sentences (cached); see the module docstring. gensim's 5 passes suit
    large corpora; a corpus of a few million words gives better vectors with more."""
    settings = WORD2VEC | {"epochs": epochs}
    hp = data.hparams
    data.unlabeled_keys()  # tokenised first, so that its cache key is known
    identity = [data.cache_keys.get("train"), data.cache_keys.get("validation"), hp.val_fraction, hp.seed,
                data.cache_keys.get("unlabeled"), dim, seed, settings, VERSION]
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

    corpus = _Sentences(data)
    workers = int(os.environ.get("OMP_NUM_THREADS") or 0) or os.cpu_count() or 1
    epochs, options = settings["epochs"], {k: v for k, v in settings.items() if k != "epochs"}
    model = Word2Vec(vector_size=dim, seed=seed, workers=workers, **options)
    model.build_vocab(corpus)
    with tqdm(total=epochs, desc=f"word2vec ({len(model.wv):,} words, {dim} dimensions)", unit="epoch") as bar:
        model.train(corpus, total_examples=model.corpus_count, epochs=epochs, callbacks=[Progress(bar)])
    return list(model.wv.index_to_key), np.asarray(model.wv.vectors, dtype=np.float32)
