"""Warm start: begin training from a stored model instead of from scratch (``--model.init_from``).

The typical retrain is the model in production plus new labelled data. The new run keeps the
stored model's encoders and attention, its vectors for the words both vocabularies share, and its
head when the labels are the same (as a set); a new label set gets a new head. Words the stored
model did not know start from its unknown-word vector, so before any step the new network scores
every text as the stored model does (when the labels are the same), and training moves on from there.

The run segments its data in the stored model's language unless ``--data.language`` says otherwise
(``data_language``); a different one stops the run, as its words would share nothing with the model's.
"""

from __future__ import annotations

import json

import torch

from han.model import HAN
from han.saved_model import CONFIG_FILE, SavedModel
from han.segment import SegmenterConfig
from han.vocab import Vocabulary

ARCHITECTURE = ("embed_dim", "word_hidden", "sentence_hidden", "attention_dim")


def load_stored(ref: str) -> SavedModel:
    """A model by BentoML tag or model directory (one clear error if neither)."""
    import model_store

    try:
        return model_store.load(ref)
    except model_store.ModelNotFoundError as e:
        raise ValueError(f"model.init_from: {e}") from None


def stored_language(ref: str) -> str:
    """The language a stored model segments in (its config's ``segmenter.language``), without its tensors."""
    import model_store

    try:
        directory = model_store.model_path(ref)
    except model_store.ModelNotFoundError as e:
        raise ValueError(f"model.init_from: {e}") from None
    try:
        language = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8")).get("segmenter", {})["language"]
    except KeyError:  # a model saved without one: the segmenter's default
        return SegmenterConfig().language
    except (OSError, ValueError, AttributeError, TypeError):
        return load_stored(ref).segmenter.language  # a broken model directory: its loader's one-line error
    return str(language)


def data_language(language: str | None, init_from: str | None) -> tuple[str, str | None]:
    """The data's language (``--data.language``, None when not given) for a run warm-started from
    ``init_from`` (or not: None), and a line to log when it comes from the stored model. A given
    language other than the stored model's raises ValueError: a warm start across languages reuses nothing."""
    if not init_from:
        return language or SegmenterConfig().language, None
    stored = stored_language(init_from)
    if language is None:
        return stored, f"data.language={stored}: the language of the stored model (model.init_from {init_from})"
    if language != stored:
        raise ValueError(f"model.init_from: the stored model ({init_from}) is in language {stored!r}, this run's "
                         f"data.language is {language!r}; a warm start across languages reuses nothing (start "
                         f"without model.init_from, or drop data.language to take {stored!r})")
    return language, None


@torch.no_grad()
def warm_start(net: HAN, stored: SavedModel, vocab: Vocabulary, labels: list[str]) -> str:
    """Copy what carries over from ``stored`` into ``net`` (built for ``vocab`` and ``labels``); returns a summary."""
    source = stored.model
    for name in ARCHITECTURE:
        if getattr(net.config, name) != getattr(source.config, name):
            raise ValueError(f"model.init_from: the stored model has {name}={getattr(source.config, name)}, "
                             f"this run {getattr(net.config, name)}")
    if net.config.sentence_values != source.config.sentence_values:
        raise ValueError(f"model.init_from: the stored model has sentence_values={source.config.sentence_values}, "
                         f"this run {net.config.sentence_values}")
    for part in ("word_rnn", "word_attention", "sentence_rnn", "sentence_attention"):
        getattr(net, part).load_state_dict(getattr(source, part).state_dict())

    old = source.embedding.weight
    new = net.embedding.weight
    shared = 0
    for i, token in enumerate(vocab.itos):
        j = stored.vocab.stoi.get(token)
        if j is not None:
            new[i] = old[j]
            shared += 1
        elif i != vocab.pad_id:
            new[i] = old[stored.vocab.unk_id]

    same_task = net.config.multi_label == source.config.multi_label
    if same_task and set(labels) == set(stored.labels):
        order = [stored.labels.index(label) for label in labels]
        net.head.weight.copy_(source.head.weight[order])
        net.head.bias.copy_(source.head.bias[order])
        head = "kept its head (same labels)"
    else:
        head = "a new head (other labels)" if same_task else "a new head (single- vs multi-label)"
    return (f"warm start: encoders and attention from the stored model, its vectors for {shared:,} of "
            f"{len(vocab):,} words, {head}")
