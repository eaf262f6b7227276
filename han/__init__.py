"""Hierarchical Attention Network for document classification: model, preprocessing, explanations.

Plain PyTorch and spaCy; no training framework or serving code lives here.
"""

from han.batch import Batch, collate, collate_flat
from han.model import HAN, HANConfig, HANOutput
from han.predict import InvalidDocumentError, Prediction, Predictor, SentenceWeight, WordWeight
from han.saved_model import ModelDirectoryError, SavedModel
from han.segment import EmptyDocumentError, Segment, Segmenter, SegmenterConfig
from han.vocab import Vocabulary

__all__ = [
    "HAN",
    "Batch",
    "EmptyDocumentError",
    "HANConfig",
    "HANOutput",
    "InvalidDocumentError",
    "ModelDirectoryError",
    "Prediction",
    "Predictor",
    "SavedModel",
    "Segment",
    "Segmenter",
    "SegmenterConfig",
    "SentenceWeight",
    "Vocabulary",
    "WordWeight",
    "collate",
    "collate_flat",
]
