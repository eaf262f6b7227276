"""Explanations other than attention: which sentences and words drove a prediction.

Each method scores every sentence and word of a batch for the label the model predicted (the top
label), in the layout of ``HANOutput``: sentence weights [docs, max_sentences] and word weights
[docs, max_sentences, max_words], zero on padding.

    attention              the model's own attention (>= 0); a word's weight is within its sentence
    attention_gradient     attention times the gradient of the label's probability with respect to
                           it (Serrano & Smith, 2019); signed; one backward pass
    integrated_gradients   over the word encoder's input (the embeddings) from an all-zero baseline
                           (Sundararajan et al., 2017), summed per word and per sentence; signed, and the
                           words of a document add up to p(label | text) - p(label | nothing)
    occlusion              the drop in the label's probability when the sentence (or the word, made
                           unknown) is taken out; signed; batched forward passes, no gradients

Except for attention, a word's weight is its share of the whole document's prediction.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from han.batch import Batch
from han.model import HAN, to_documents
from han.vocab import Vocabulary

METHODS = ("attention", "attention_gradient", "integrated_gradients", "occlusion")
SIGNED = frozenset({"attention_gradient", "integrated_gradients", "occlusion"})
WITHIN_SENTENCE = frozenset({"attention"})  # word weights relative to their sentence, not the document
IG_STEPS = 32  # Gauss-Legendre points: completeness within a few % on the models tried


def attribute(model: HAN, batch: Batch, method: str, target: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(logits, sentence weights, word weights) of ``method`` for ``target`` (default: each document's
    top label). ``model`` must be in eval mode."""
    if method not in METHODS:
        raise ValueError(f"unknown explanation method {method!r}; choose one of {', '.join(METHODS)}")
    if method == "attention":
        with torch.inference_mode():
            out = model(*batch)
        return out.logits, out.sentence_weights, out.word_weights
    # Callers may run under inference mode (Lightning's test loop does): step out of it, with copies
    # of the batch's tensors, which inference mode made unusable for autograd.
    with torch.inference_mode(False), torch.enable_grad():
        batch = Batch(*(t.clone() for t in batch))
        return _METHODS[method](model, batch, target)


def _label_probability(model: HAN, logits: Tensor, target: Tensor | None) -> tuple[Tensor, Tensor]:
    """p(target) per document, and the target (each document's top label if None)."""
    if target is None:
        target = logits.argmax(-1)
    probs = model.probabilities(logits)
    return probs.gather(1, target.unsqueeze(1)).squeeze(1), target


def _capturing(module: torch.nn.Module, store: list[Tensor]) -> torch.utils.hooks.RemovableHandle:
    """Keep the attention weights a module returns (they are in the graph: gradients reach them)."""
    return module.register_forward_hook(lambda _m, _i, output: store.append(output[1]))


def attention_gradient(model: HAN, batch: Batch, target: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    word: list[Tensor] = []
    sentence: list[Tensor] = []
    hooks = [_capturing(model.word_attention, word), _capturing(model.sentence_attention, sentence)]
    try:
        with torch.enable_grad():
            out = model(*batch)
            p, _ = _label_probability(model, out.logits, target)
            grad_word, grad_sentence = torch.autograd.grad(p.sum(), [word[0], sentence[0]])
    finally:
        for hook in hooks:
            hook.remove()
    word_scores = to_documents((word[0] * grad_word).detach(), batch.document_lengths)
    return out.logits.detach(), (sentence[0] * grad_sentence).detach(), word_scores


def integrated_gradients(
    model: HAN, batch: Batch, target: Tensor | None, steps: int = IG_STEPS
) -> tuple[Tensor, Tensor, Tensor]:
    with torch.inference_mode():
        logits = model(*batch).logits
    target = logits.argmax(-1) if target is None else target
    embedded = model.embed(batch.words).detach()  # the word encoder's input: embeddings (+ NB features)
    total = torch.zeros_like(embedded)
    points, weights = np.polynomial.legendre.leggauss(steps)  # Gauss-Legendre on [0, 1], as Captum does
    scale = 1.0
    grabbed: list[Tensor] = []

    def scaled(_module: torch.nn.Module, inputs: tuple) -> tuple:
        # A leaf of its own: the gradient is taken at this point whether or not the embedding table
        # itself is trainable (it is frozen for the first epochs of a fit).
        grabbed.append((inputs[0] * scale).detach().requires_grad_())
        return (grabbed[-1], *inputs[1:])

    handle = model.word_rnn.register_forward_pre_hook(scaled)
    try:
        for point, weight in zip((points + 1) / 2, weights / 2, strict=True):
            scale = float(point)
            grabbed.clear()
            with torch.enable_grad():
                p, _ = _label_probability(model, model(*batch).logits, target)
                (grad,) = torch.autograd.grad(p.sum(), grabbed)
            total += float(weight) * grad
    finally:
        handle.remove()
    per_word = (embedded * total).sum(-1)  # [sentences, max_words]; padding embeds to 0
    word_scores = to_documents(per_word, batch.document_lengths)
    return logits, word_scores.sum(-1), word_scores


def occlusion(model: HAN, batch: Batch, target: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    with torch.inference_mode():
        logits = model(*batch).logits
        p, target = _label_probability(model, logits, target)
        sentence_drop = _sentence_occlusion(model, batch, target, p)
        word_drop = _word_occlusion(model, batch, target, p)
    return logits, sentence_drop, word_drop


def _documents(batch: Batch) -> list[tuple[Tensor, Tensor]]:
    """The batch as (words rows, sentence lengths) per document."""
    lengths = batch.document_lengths.tolist()
    return list(zip(batch.words.split(lengths), batch.sentence_lengths.split(lengths), strict=True))


def _variants_probability(
    model: HAN, variants: list[tuple[Tensor, Tensor]], target: Tensor, max_docs: int = 256
) -> Tensor:
    """p(target[i]) for each variant document i (rows, lengths), in batches of ``max_docs``."""
    out = []
    for start in range(0, len(variants), max_docs):
        chunk = variants[start : start + max_docs]
        width = max(rows.shape[1] for rows, _ in chunk)
        words = torch.cat([torch.nn.functional.pad(rows, (0, width - rows.shape[1])) for rows, _ in chunk])
        lengths = torch.cat([n for _, n in chunk])
        docs = torch.tensor([len(n) for _, n in chunk])
        p, _ = _label_probability(model, model(words, lengths, docs).logits, target[start : start + len(chunk)])
        out.append(p)
    return torch.cat(out)


_NOTHING = (torch.tensor([[Vocabulary.unk_id]]), torch.tensor([1]))  # a document with its only sentence taken out


def _sentence_occlusion(model: HAN, batch: Batch, target: Tensor, p: Tensor) -> Tensor:
    variants, owner = [], []
    for d, (rows, lengths) in enumerate(_documents(batch)):
        for s in range(len(lengths)):
            keep = [i for i in range(len(lengths)) if i != s]
            variants.append((rows[keep], lengths[keep]) if keep else _NOTHING)
            owner.append(d)
    owners = torch.tensor(owner)
    drops = p[owners] - _variants_probability(model, variants, target[owners])
    return to_documents(drops, batch.document_lengths)


def _word_occlusion(model: HAN, batch: Batch, target: Tensor, p: Tensor) -> Tensor:
    """Leave one word out (made unknown): the drop, per word."""
    variants, owner = [], []
    for d, (rows, lengths) in enumerate(_documents(batch)):
        for s, n in enumerate(lengths.tolist()):
            for w in range(n):
                changed = rows.clone()
                changed[s, w] = Vocabulary.unk_id
                variants.append((changed, lengths))
                owner.append(d)
    owners = torch.tensor(owner)
    drops = p[owners] - _variants_probability(model, variants, target[owners])
    per_word = torch.zeros(batch.words.shape, dtype=drops.dtype)
    per_word[torch.arange(batch.words.shape[1]) < batch.sentence_lengths[:, None]] = drops  # row-major: (s, w)
    return to_documents(per_word, batch.document_lengths)


_METHODS: dict[str, Callable[[HAN, Batch, Tensor | None], tuple[Tensor, Tensor, Tensor]]] = {
    "attention_gradient": attention_gradient,
    "integrated_gradients": integrated_gradients,
    "occlusion": occlusion,
}
