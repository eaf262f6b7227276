"""Hierarchical Attention Network for document classification: model, preprocessing, the inference pipeline.

Plain PyTorch, numpy and spaCy; no training framework or serving code lives here.

    segment.py       text -> sentences and words with character offsets (spaCy's tokenizer)
    vocab.py         words -> ids, built from training documents
    batch.py         encoded documents -> the model's flat batch tensors
    config.py        the network's settings (HANConfig), read without torch
    model.py         the network (HAN), in PyTorch: training and the gradient-based explanations
    cpu_kernels.py   the network's recurrences done fast on a CPU
    numpy_forward.py the network's forward without gradients, in numpy: classification needs no torch
    ngrams.py        the optional n-gram head, averaged with the HAN's probabilities
    calibration.py   temperature scaling and expected calibration error
    vectors.py       pretrained word vectors for the embedding table
    saved_model.py   a model directory: config.json, vocab.json, labels.json, safetensors
    pipeline.py      the one inference path: check -> segment -> encode -> forward -> decide -> explain
    results.py       the result types every caller returns
    methods.py       the explanation methods' names and the ``explain`` vocabulary (no torch)
    attribution.py   the explanation methods other than attention
    faithfulness.py  how far an explanation can be trusted: removing what it points at
    environment.py   the process settings every entry point applies (no torch until asked)
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports are the package's public names, re-exported lazily below)

import functools
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the public names, listed only here: type checkers read them, and so does _public below
    from han.batch import Batch, collate, collate_flat
    from han.config import HANConfig
    from han.model import HAN, HANOutput
    from han.pipeline import InvalidDocumentError, Pipeline, TopK, document_problem
    from han.results import DocumentError, DocumentResult, SentenceWeight, WordWeight
    from han.saved_model import ModelDirectoryError, SavedModel
    from han.segment import EmptyDocumentError, LanguageError, Segment, Segmenter, SegmenterConfig, check_language
    from han.vocab import Vocabulary


@functools.cache
def _public() -> dict[str, str]:
    """Each public name's module, read from the ``if TYPE_CHECKING:`` imports of this file."""
    import ast

    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    return {alias.name: node.module for node in block.body for alias in node.names}  # type: ignore[attr-defined]


def __getattr__(name: str) -> Any:
    """The public names load on first use (PEP 562), so that ``han.environment`` and ``han.methods`` import
    without torch and spaCy: han-score's Ray engine starts Ray before them."""
    if name == "__all__":
        return list(_public())
    if name not in _public():
        raise AttributeError(f"module 'han' has no attribute {name!r}")
    value = getattr(importlib.import_module(_public()[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_public()])
