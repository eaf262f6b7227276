"""Hierarchical Attention Network for document classification: model, preprocessing, the inference pipeline.

Plain PyTorch and spaCy; no training framework or serving code lives here.

    segment.py  vocab.py  batch.py   text -> sentences of word ids -> flat batch tensors
    model.py                         the network (HANConfig, HAN)
    saved_model.py                   a model directory: config.json, vocab.json, labels.json, safetensors
    pipeline.py  results.py          the one inference path (check -> segment -> encode -> forward ->
                                     decide -> explain) and the result types every caller returns
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from han.batch import Batch, collate, collate_flat
    from han.model import HAN, HANConfig, HANOutput
    from han.pipeline import InvalidDocumentError, Pipeline, TopK, document_problem
    from han.results import DocumentError, DocumentResult, SentenceWeight, WordWeight
    from han.saved_model import ModelDirectoryError, SavedModel
    from han.segment import EmptyDocumentError, LanguageError, Segment, Segmenter, SegmenterConfig, check_language
    from han.vocab import Vocabulary

# The names below load on first use (PEP 562), so that ``han.environment`` (every entry point's
# first import) does not import torch and spaCy: han-score --engine ray starts Ray before them.
_WHERE = {
    "Batch": "han.batch",
    "collate": "han.batch",
    "collate_flat": "han.batch",
    "HAN": "han.model",
    "HANConfig": "han.model",
    "HANOutput": "han.model",
    "InvalidDocumentError": "han.pipeline",
    "Pipeline": "han.pipeline",
    "TopK": "han.pipeline",
    "document_problem": "han.pipeline",
    "DocumentError": "han.results",
    "DocumentResult": "han.results",
    "SentenceWeight": "han.results",
    "WordWeight": "han.results",
    "ModelDirectoryError": "han.saved_model",
    "SavedModel": "han.saved_model",
    "EmptyDocumentError": "han.segment",
    "LanguageError": "han.segment",
    "check_language": "han.segment",
    "Segment": "han.segment",
    "Segmenter": "han.segment",
    "SegmenterConfig": "han.segment",
    "Vocabulary": "han.vocab",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'han' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "HAN",
    "Batch",
    "DocumentError",
    "DocumentResult",
    "EmptyDocumentError",
    "HANConfig",
    "HANOutput",
    "InvalidDocumentError",
    "LanguageError",
    "ModelDirectoryError",
    "Pipeline",
    "SavedModel",
    "Segment",
    "Segmenter",
    "SegmenterConfig",
    "SentenceWeight",
    "TopK",
    "Vocabulary",
    "WordWeight",
    "check_language",
    "collate",
    "collate_flat",
    "document_problem",
]
