"""The network's settings (``config.json``'s "model"), apart from the network: reading a model needs them
before, or without, torch (``han.numpy_forward``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

SENTENCE_VALUES = ("contextual", "own")


@dataclass
class HANConfig:
    """Everything needed to build the network (saved as part of ``config.json``)."""

    vocab_size: int
    num_labels: int
    multi_label: bool = False
    embed_dim: int = 100
    word_hidden: int = 50
    sentence_hidden: int = 50
    attention_dim: int = 100
    dropout: float = 0.3
    word_dropout: float = 0.1  # training only: this share of words is replaced by <unk>
    # What the sentence attention averages into the document vector: "contextual", the sentence
    # BiGRU's states (Yang et al.); or "own", each sentence's own vector from the word level, the
    # BiGRU then only scoring them. With "own", a sentence's weight is its share of the document
    # vector and removing it changes no other sentence's vector: sentence explanations are more faithful.
    sentence_values: str = "contextual"

    def __post_init__(self) -> None:
        if self.sentence_values not in SENTENCE_VALUES:
            choices = ", ".join(SENTENCE_VALUES)
            raise ValueError(f"sentence_values must be one of {choices}, not {self.sentence_values!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HANConfig:
        known = {f.name for f in fields(cls)}
        data = dict(data)
        if data.pop("nb_features", 0):  # a setting removed after it scored worse
            raise ValueError("nb_features (Naive Bayes features beside the embedding) is no longer supported")
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        return cls(**data)
