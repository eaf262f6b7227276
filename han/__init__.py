"""Hierarchical Attention Network for document classification: model, preprocessing, the inference pipeline.

Plain PyTorch and spaCy; no training framework or serving code lives here.

    segment.py  vocab.py  batch.py   text -> sentences of word ids -> flat batch tensors
    model.py                         the network (HANConfig, HAN)
    saved_model.py                   a model directory: config.json, vocab.json, labels.json, safetensors
    pipeline.py  results.py          the one inference path (check -> segment -> encode -> forward ->
                                     decide -> explain) and the result types every caller returns
"""

from han.batch import Batch, collate, collate_flat
from han.model import HAN, HANConfig, HANOutput
from han.pipeline import InvalidDocumentError, Pipeline, TopK, document_problem
from han.results import DocumentError, DocumentResult, SentenceWeight, WordWeight
from han.saved_model import ModelDirectoryError, SavedModel
from han.segment import EmptyDocumentError, Segment, Segmenter, SegmenterConfig
from han.vocab import Vocabulary

__all__ = [
    "HAN",
    "Batch",
    "DocumentError",
    "DocumentResult",
    "EmptyDocumentError",
    "HANConfig",
    "HANOutput",
    "InvalidDocumentError",
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
    "collate",
    "collate_flat",
    "document_problem",
]
