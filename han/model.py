"""Hierarchical Attention Network (Yang et al., NAACL 2016), in plain PyTorch.

A batch is a flat list of sentences (each a row of word ids, documents one after another)
with the number of words in each sentence and the number of sentences in each document:

    words  [num_sentences, max_words]  ->  embedding  ->  BiGRU over words (packed)
           ->  word attention (tanh MLP, learned context vector, softmax over real words)
    sentence vectors grouped per document  [docs, max_sentences, 2*word_hidden]
           ->  BiGRU over sentences (packed)  ->  sentence attention (same, over real sentences)
    document vector  ->  dropout  ->  linear head  ->  logits [docs, num_labels]

Packing means padding costs no recurrent compute, and no document's output depends on the
others in its batch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


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
    embed_dropout: float = 0.1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HANConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        return cls(**data)


class HANOutput(NamedTuple):
    logits: Tensor  # [docs, num_labels]
    word_weights: Tensor  # [docs, max_sentences, max_words]; 0 on padding
    sentence_weights: Tensor  # [docs, max_sentences]; 0 on padding


class Attention(nn.Module):
    """Additive attention with a learned context vector, softmax over unmasked positions."""

    def __init__(self, input_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_dim, attention_dim)
        self.context = nn.Parameter(torch.empty(attention_dim).uniform_(-0.1, 0.1))

    def forward(self, h: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """h [rows, steps, dim], mask [rows, steps] (True = real) -> ([rows, dim], weights [rows, steps])."""
        scores = torch.tanh(self.proj(h)) @ self.context
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return torch.bmm(weights.unsqueeze(1), h).squeeze(1), weights


class HAN(nn.Module):
    """The network. ``forward`` takes a flat batch (see module docstring) and returns HANOutput."""

    def __init__(self, config: HANConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=0)
        self.embed_dropout = nn.Dropout(config.embed_dropout)
        self.word_rnn = nn.GRU(config.embed_dim, config.word_hidden, batch_first=True, bidirectional=True)
        self.word_attention = Attention(2 * config.word_hidden, config.attention_dim)
        self.sentence_rnn = nn.GRU(2 * config.word_hidden, config.sentence_hidden, batch_first=True, bidirectional=True)
        self.sentence_attention = Attention(2 * config.sentence_hidden, config.attention_dim)
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(2 * config.sentence_hidden, config.num_labels)

    def forward(self, words: Tensor, sentence_lengths: Tensor, document_lengths: Tensor) -> HANOutput:
        """words [sentences, max_words] of ids; sentence_lengths [sentences]; document_lengths [docs]."""
        max_words = words.shape[1]
        # Words -> sentence vectors.
        x = self.embed_dropout(self.embedding(words))
        h = self._run_packed(self.word_rnn, x, sentence_lengths, max_words)
        word_mask = torch.arange(max_words, device=words.device) < sentence_lengths.unsqueeze(1)
        sentence_vectors, word_weights = self.word_attention(h, word_mask)

        # Sentence vectors grouped per document -> document vectors.
        docs, max_sentences = document_lengths.shape[0], int(document_lengths.max())
        doc_index = torch.repeat_interleave(torch.arange(docs, device=words.device), document_lengths)
        starts = torch.cumsum(document_lengths, 0) - document_lengths
        position = torch.arange(words.shape[0], device=words.device) - starts[doc_index]
        grouped = sentence_vectors.new_zeros(docs, max_sentences, sentence_vectors.shape[1])
        grouped[doc_index, position] = sentence_vectors
        g = self._run_packed(self.sentence_rnn, grouped, document_lengths, max_sentences)
        sentence_mask = torch.arange(max_sentences, device=words.device) < document_lengths.unsqueeze(1)
        document_vectors, sentence_weights = self.sentence_attention(g, sentence_mask)

        logits = self.head(self.dropout(document_vectors))
        word_grid = word_weights.new_zeros(docs, max_sentences, max_words)
        word_grid[doc_index, position] = word_weights
        return HANOutput(logits, word_grid, sentence_weights)

    @staticmethod
    def _run_packed(rnn: nn.GRU, x: Tensor, lengths: Tensor, total_length: int) -> Tensor:
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = rnn(packed)
        return pad_packed_sequence(out, batch_first=True, total_length=total_length)[0]

    def probabilities(self, logits: Tensor) -> Tensor:
        """Label scores: sigmoid per label for multi-label models, softmax otherwise."""
        return torch.sigmoid(logits) if self.config.multi_label else torch.softmax(logits, dim=-1)
