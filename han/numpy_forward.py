"""The HAN's forward pass without gradients, in numpy: what serving, han-score and evaluation run.

The same network as ``han.model`` (its weights, by the same names), computed without torch, so that a
process that only classifies never imports it: ``import torch`` alone is about 200 MB of a serving
worker's memory. Torch is imported only where gradients are needed (training, the gradient-based
explanations). The arithmetic follows ``han.cpu_kernels``: real positions only, flat, both directions
of a BiGRU one packed step at a time, each distinct word projected once.

A batch is each document's word ids one after another, the words in each sentence and the sentences in
each document (``han.batch`` pads the same into a matrix for torch). ``tests/test_numpy_forward.py``
keeps the outputs equal to the torch model's.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from han.config import HANConfig


class Forward(NamedTuple):
    logits: np.ndarray  # [docs, labels], float32
    word_weights: np.ndarray  # [docs, max_sentences, max_words]; 0 on padding
    sentence_weights: np.ndarray  # [docs, max_sentences]; 0 on padding
    document_vectors: np.ndarray | None  # [docs, head input]: what the head reads (None from an attribution)


def weight_shapes(config: HANConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of ``han.model.HAN`` by its state-dict name, with its shape."""
    shapes: dict[str, tuple[int, ...]] = {"embedding.weight": (config.vocab_size, config.embed_dim)}
    for rnn, (inputs, hidden) in {"word_rnn": (config.embed_dim, config.word_hidden),
                                  "sentence_rnn": (2 * config.word_hidden, config.sentence_hidden)}.items():
        for direction in ("forward_rnn", "backward_rnn"):
            p = f"{rnn}.{direction}"
            shapes |= {f"{p}.weight_ih_l0": (3 * hidden, inputs), f"{p}.weight_hh_l0": (3 * hidden, hidden),
                       f"{p}.bias_ih_l0": (3 * hidden,), f"{p}.bias_hh_l0": (3 * hidden,)}
    for attention, width in {"word_attention": 2 * config.word_hidden,
                             "sentence_attention": 2 * config.sentence_hidden}.items():
        shapes |= {f"{attention}.proj.weight": (config.attention_dim, width),
                   f"{attention}.proj.bias": (config.attention_dim,), f"{attention}.context": (config.attention_dim,)}
    own = config.sentence_values == "own"
    head_in = 2 * (config.word_hidden if own else config.sentence_hidden)
    return shapes | {"head.weight": (config.num_labels, head_in), "head.bias": (config.num_labels,)}


def check_weights(config: HANConfig, weights: dict[str, np.ndarray]) -> None:
    """ValueError naming what is missing, extra or of the wrong shape."""
    expected = weight_shapes(config)
    missing, extra = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    wrong = [f"{k} {tuple(weights[k].shape)} (expected {expected[k]})"
             for k in sorted(set(expected) & set(weights)) if tuple(weights[k].shape) != expected[k]]
    problems = [f"missing {', '.join(missing)}"] * bool(missing) + [f"unexpected {', '.join(extra)}"] * bool(extra)
    if wrong:
        problems.append(f"wrong shape: {', '.join(wrong)}")
    if problems:
        raise ValueError("; ".join(problems))


def _sigmoid_of_double(x: np.ndarray) -> np.ndarray:
    """In place: sigmoid(2x) = (1 + tanh(x)) / 2 (numpy's tanh is much cheaper than its exp)."""
    np.tanh(x, out=x)
    x += 1
    x *= 0.5
    return x


class BiGRU:
    """Both directions of a BiGRU over flat sequences (``han.model.BiGRU.read``)."""

    def __init__(self, weights: dict[str, np.ndarray], prefix: str) -> None:
        f, b = (f"{prefix}.{d}_rnn" for d in ("forward", "backward"))
        self.hidden = weights[f"{f}.weight_hh_l0"].shape[1]

        def both(name: str) -> np.ndarray:  # [2, ...]: the forward direction's, then the backward's
            return np.stack([weights[f"{f}.{name}"], weights[f"{b}.{name}"]]).astype(np.float32)

        # the input projection of both directions in one product: row 2i of its output (viewed as
        # [2 * inputs, 3 * hidden]) is input i's forward part, row 2i + 1 its backward part
        # The r and z gates' rows halved: sigmoid(a) is computed as sigmoid(2 (a / 2)) (_sigmoid_of_double).
        half = np.ones(3 * self.hidden, dtype=np.float32)
        half[: 2 * self.hidden] = 0.5  # exact in floating point
        self.w_ih = np.ascontiguousarray((np.concatenate(both("weight_ih_l0")) * np.tile(half, 2)[:, None]).T)
        self.b_ih = np.concatenate(both("bias_ih_l0")) * np.tile(half, 2)
        self.w_hh = np.ascontiguousarray((both("weight_hh_l0") * half[:, None]).transpose(0, 2, 1))
        self.b_hh = (both("bias_hh_l0") * half)[:, None]

    def __call__(self, inputs: np.ndarray, lengths: np.ndarray, index: np.ndarray | None = None) -> np.ndarray:
        """inputs [rows, dim]; lengths [sequences], summing to the positions; position k reads
        ``inputs[index[k]]`` (or ``inputs[k]``) -> [positions, 2 * hidden], flat in the same order."""
        hidden = self.hidden
        projected = (inputs @ self.w_ih + self.b_ih).reshape(-1, 3 * hidden)
        forward_at, backward_at, sizes = packed_order(lengths)
        if index is None:
            read = np.stack([2 * forward_at, 2 * backward_at + 1])
        else:
            read = np.stack([2 * index[forward_at], 2 * index[backward_at] + 1])
        gi_all = projected[read]  # [2, entries, 3 * hidden], in packed order
        states = np.empty((2, len(forward_at), hidden), dtype=np.float32)
        h = np.zeros((2, sizes[0], hidden), dtype=np.float32)
        at = 0
        for size in sizes:
            gi, h = gi_all[:, at : at + size], h[:, :size]  # sorted longest first: the running ones
            gh = np.matmul(h, self.w_hh)
            gh += self.b_hh
            rz = gh[..., : 2 * hidden]
            rz += gi[..., : 2 * hidden]
            _sigmoid_of_double(rz)
            n = gh[..., 2 * hidden :]
            n *= rz[..., :hidden]
            n += gi[..., 2 * hidden :]
            np.tanh(n, out=n)
            out = states[:, at : at + size]
            np.subtract(h, n, out=out)
            out *= rz[..., hidden:]
            out += n
            h = out
            at += size
        flat = np.empty((len(forward_at), 2 * hidden), dtype=np.float32)
        flat[forward_at, :hidden] = states[0]
        flat[backward_at, hidden:] = states[1]
        return flat


def packed_order(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """``han.cpu_kernels.packed_order``: the flat position each direction reads at each packed entry
    (time-major, sequences longest first), and the sequences still running at each step."""
    rows = np.argsort(-lengths, kind="stable")
    sorted_lengths = lengths[rows]
    starts = (np.cumsum(lengths) - lengths)[rows]
    step = np.arange(int(sorted_lengths[0]))[:, None]
    running = step < sorted_lengths  # [steps, sequences]
    forward = np.broadcast_to(starts + step, running.shape)[running]
    backward = np.broadcast_to(starts + sorted_lengths - 1 - step, running.shape)[running]
    return forward, backward, running.sum(1).tolist()


class Attention:
    """Additive attention with a learned context vector (``han.model.Attention``), over flat rows."""

    def __init__(self, weights: dict[str, np.ndarray], prefix: str) -> None:
        self.w = np.ascontiguousarray(weights[f"{prefix}.proj.weight"].astype(np.float32).T)
        self.b = weights[f"{prefix}.proj.bias"].astype(np.float32)
        self.c = weights[f"{prefix}.context"].astype(np.float32)

    def __call__(self, flat: np.ndarray, lengths: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """flat [positions, dim], each row's positions one row after another; lengths [rows] ->
        (the weighted average of ``values`` per row [rows, values' dim], weights [rows, max length])."""
        a = flat @ self.w
        a += self.b
        scores = np.tanh(a, out=a) @ self.c
        starts = np.cumsum(lengths) - lengths  # each row's positions are contiguous, and at least one
        rows = np.repeat(np.arange(len(lengths)), lengths)
        e = np.exp(scores - np.maximum.reduceat(scores, starts)[rows])
        w = e / np.add.reduceat(e, starts)[rows]
        weights = np.zeros((len(lengths), int(lengths.max())), dtype=np.float32)
        weights[rows, np.arange(len(rows)) - starts[rows]] = w
        return np.add.reduceat(w[:, None] * values, starts), weights


class NumpyHAN:
    """``han.model.HAN`` in evaluation mode, without gradients, from its weights."""

    def __init__(self, config: HANConfig, weights: dict[str, np.ndarray]) -> None:
        check_weights(config, weights)
        self.config = config
        self.embedding = np.asarray(weights["embedding.weight"], dtype=np.float32)
        self.word_rnn = BiGRU(weights, "word_rnn")
        self.sentence_rnn = BiGRU(weights, "sentence_rnn")
        self.word_attention = Attention(weights, "word_attention")
        self.sentence_attention = Attention(weights, "sentence_attention")
        self.head_w = np.ascontiguousarray(weights["head.weight"].astype(np.float32).T)
        self.head_b = weights["head.bias"].astype(np.float32)

    @property
    def head_width(self) -> int:
        return self.head_w.shape[0]

    def __call__(self, ids: np.ndarray, sentence_lengths: np.ndarray, document_lengths: np.ndarray) -> Forward:
        """ids: every word id, documents one after another; sentence_lengths [sentences] (each at least 1);
        document_lengths [docs] (each at least 1)."""
        distinct, index = np.unique(ids, return_inverse=True)  # each distinct word projected once
        states = self.word_rnn(self.embedding[distinct], sentence_lengths, index.reshape(-1))
        sentences, word_weights = self.word_attention(states, sentence_lengths, states)
        g = self.sentence_rnn(sentences, document_lengths)
        values = sentences if self.config.sentence_values == "own" else g
        documents, sentence_weights = self.sentence_attention(g, document_lengths, values)
        logits = documents @ self.head_w + self.head_b
        return Forward(logits, to_documents(word_weights, document_lengths), sentence_weights, documents)

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """Label scores: sigmoid per label for multi-label models, softmax otherwise (float64)."""
        z = np.asarray(logits, dtype=np.float64)
        if self.config.multi_label:
            return 1 / (1 + np.exp(-z))
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


def to_documents(per_sentence: np.ndarray, document_lengths: np.ndarray) -> np.ndarray:
    """Rows of the flat sentence list grouped per document [docs, max_sentences, ...], zero-padded."""
    docs = len(document_lengths)
    rows = np.repeat(np.arange(docs), document_lengths)
    position = np.arange(len(rows)) - (np.cumsum(document_lengths) - document_lengths)[rows]
    grouped = np.zeros((docs, int(document_lengths.max()), *per_sentence.shape[1:]), dtype=per_sentence.dtype)
    grouped[rows, position] = per_sentence
    return grouped
