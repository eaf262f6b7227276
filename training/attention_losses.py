"""Training-only losses on the sentence attention, so that the sentences it shows carry the label.

Left alone, a HAN's sentence attention stays nearly flat: the label rests on every sentence a
little, and attention's top sentence explains little of it (docs/explanations.md). Two remedies,
each a weight on ``HANModule``:

- ``sentence_focus``: the attention's entropy, pushing it onto fewer sentences, whichever they are.
- ``sentence_evidence``: cross-entropy of the attention against each training document's most
  telling sentence, the one whose value alone (the head applied to it) best predicts the document's
  label. Attention learns to find the sentences that say the label by themselves (a sentence-level
  reading of multiple-instance learning, Angelidis & Lapata 2018), so removing its top sentence
  costs the label most.

Both are divided by log n (1 for a flat attention, 0 for all of it on one sentence, or on the telling
one) and averaged over the documents of more than one sentence.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sentence_entropy(weights: Tensor, document_lengths: Tensor) -> Tensor:
    """The sentence attention's entropy as a share of its largest (log n), averaged over the documents of
    more than one sentence (0 when there are none): 1 is a flat attention, 0 all on one sentence."""
    several = document_lengths > 1
    if not several.any():
        return weights.new_zeros(())
    w = weights[several]
    entropy = -(w * torch.log(w.clamp_min(1e-12))).sum(-1)
    return (entropy / torch.log(document_lengths[several].to(w.dtype))).mean()


def sentence_evidence(weights: Tensor, sentence_logits: Tensor, document_lengths: Tensor, target: Tensor,
                      multi_label: bool) -> Tensor:
    """-log(the attention on each document's most telling sentence) / log n, averaged over the documents
    of more than one sentence (0 when there are none; 0 for a document whose attention is all there).

    weights [docs, max_sentences]; sentence_logits [docs, max_sentences, labels] (``HANOutput``);
    target: label ids [docs], soft rows [docs, labels] (self-training), or 0/1 rows when multi-label.
    The most telling sentence has the lowest loss against the document's target on its own. It is
    chosen without gradient, and the head gets none from this loss: what scores the sentences (the
    sentence attention, and through it both encoders) learns to find the sentence, not the head to
    agree with the attention.
    """
    several = document_lengths > 1
    if not several.any():
        return weights.new_zeros(())
    with torch.no_grad():
        logits = sentence_logits[several].float()
        rows = target[several]
        if multi_label:
            expanded = rows.float().unsqueeze(1).expand_as(logits)
            fit = -torch.nn.functional.binary_cross_entropy_with_logits(logits, expanded, reduction="none").sum(-1)
        else:
            rows = rows.float() if rows.ndim > 1 else torch.nn.functional.one_hot(rows, logits.shape[-1]).float()
            fit = (torch.log_softmax(logits, -1) * rows.unsqueeze(1)).sum(-1)
        real = torch.arange(logits.shape[1], device=logits.device) < document_lengths[several, None]
        telling = fit.masked_fill(~real, float("-inf")).argmax(-1)
    attention = weights[several].float().gather(1, telling[:, None]).squeeze(1)  # float: 1e-12 in half precision is 0
    lengths = document_lengths[several].to(attention.dtype)
    return (-torch.log(attention.clamp_min(1e-12)) / torch.log(lengths)).mean()
