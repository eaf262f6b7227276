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

Except for attention, a word's weight is its share of the whole document's prediction. The probability
explained is the network's own, before calibration's temperature and the n-gram head's share: the
score shown differs from it where either applies, and so does the words' sum.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from numpy.polynomial.legendre import leggauss
from torch import Tensor

from han.batch import Batch
from han.methods import METHODS, WITHIN_SENTENCE  # noqa: F401  (WITHIN_SENTENCE: re-exported)
from han.model import HAN, _mask, to_documents
from han.vocab import Vocabulary

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
    # The word encoder's input, the embeddings of the real words only: the encoder reads them flat, one
    # sentence after another (han.model.BiGRU.forward).
    real = _mask(batch.sentence_lengths, batch.words.shape[1])
    embedded = model.embed(batch.words[real]).detach()
    total = torch.zeros_like(embedded)
    points, weights = leggauss(steps)  # Gauss-Legendre on [0, 1], as Captum does
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
    per_word = torch.zeros(batch.words.shape, dtype=total.dtype)  # [sentences, max_words]; 0 on padding
    per_word[real] = (embedded * total).sum(-1)
    word_scores = to_documents(per_word, batch.document_lengths)
    return logits, word_scores.sum(-1), word_scores


def occlusion(model: HAN, batch: Batch, target: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    with torch.inference_mode():
        logits = model(*batch).logits
        p, target = _label_probability(model, logits, target)
        sentence_drop = _sentence_occlusion(model, batch, target, p)
        word_drop = _word_occlusion(model, batch, target, p)
    return logits, sentence_drop, word_drop


_NOTHING = (torch.tensor([[Vocabulary.unk_id]]), torch.tensor([1]))  # a sentence of one unknown word


def _sentence_occlusion(model: HAN, batch: Batch, target: Tensor, p: Tensor, max_variants: int = 1024) -> Tensor:
    """Take one sentence out: the drop, per sentence. The other sentences' vectors do not change,
    so each variant reruns only the document level on them."""
    vectors, _ = model.sentence_vectors(batch.words, batch.sentence_lengths)
    grouped = to_documents(vectors, batch.document_lengths)
    owners_all, positions_all = _sentence_owners(batch)
    width = max(grouped.shape[1] - 1, 1)
    drops = []
    for chunk in range(0, len(owners_all), max_variants):
        owners, positions = owners_all[chunk : chunk + max_variants], positions_all[chunk : chunk + max_variants]
        after = torch.arange(width)[None, :]
        source = (after + (after >= positions[:, None]).long()).clamp(max=grouped.shape[1] - 1)
        variant = grouped[owners[:, None], source]
        lengths = batch.document_lengths[owners] - 1
        if bool((lengths == 0).any()):  # its only sentence taken out: a document of one unknown word
            nothing, _ = model.sentence_vectors(*_NOTHING)
            variant[lengths == 0, 0] = nothing[0]
            lengths = lengths.clamp(min=1)
        logits, _ = model.classify(variant, lengths)
        q, _ = _label_probability(model, logits, target[owners])
        drops.append(p[owners] - q)
    return to_documents(torch.cat(drops), batch.document_lengths)


def _sentence_owners(batch: Batch) -> tuple[Tensor, Tensor]:
    """For each sentence row of the batch: its document, and its position in that document."""
    owners = torch.repeat_interleave(torch.arange(len(batch.document_lengths)), batch.document_lengths)
    starts = torch.cumsum(batch.document_lengths, 0) - batch.document_lengths
    return owners, torch.arange(len(owners)) - starts[owners]


def _word_occlusion(model: HAN, batch: Batch, target: Tensor, p: Tensor, max_variants: int = 1024) -> Tensor:
    """Leave one word out (made unknown): the drop, per word.

    A changed word changes only its own sentence's vector, so each variant re-encodes that one
    sentence and reruns the document level on the others' vectors as they were: the same numbers
    as a whole forward pass per variant, at a fraction of the word-level work.
    """
    words, lengths = batch.words, batch.sentence_lengths
    vectors, _ = model.sentence_vectors(words, lengths)
    grouped = to_documents(vectors, batch.document_lengths)
    owner_of_sentence, position_of_sentence = _sentence_owners(batch)
    rows, columns = (torch.arange(words.shape[1]) < lengths[:, None]).nonzero(as_tuple=True)  # row-major (s, w)
    drops = []
    for chunk in range(0, len(rows), max_variants):
        s, w = rows[chunk : chunk + max_variants], columns[chunk : chunk + max_variants]
        changed = words[s].clone()
        changed[torch.arange(len(s)), w] = Vocabulary.unk_id
        changed_vectors, _ = model.sentence_vectors(changed, lengths[s])
        owners = owner_of_sentence[s]
        variant = grouped[owners].clone()
        variant[torch.arange(len(s)), position_of_sentence[s]] = changed_vectors
        logits, _ = model.classify(variant, batch.document_lengths[owners])
        q, _ = _label_probability(model, logits, target[owners])
        drops.append(p[owners] - q)
    per_word = torch.zeros(words.shape, dtype=p.dtype)
    per_word[rows, columns] = torch.cat(drops) if drops else p.new_zeros(0)
    return to_documents(per_word, batch.document_lengths)


_METHODS: dict[str, Callable[[HAN, Batch, Tensor | None], tuple[Tensor, Tensor, Tensor]]] = {
    "attention_gradient": attention_gradient,
    "integrated_gradients": integrated_gradients,
    "occlusion": occlusion,
}
