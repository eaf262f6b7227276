"""The training recipe: the one place that fills the settings a config leaves unset.

A config tuned on one corpus carries that corpus's settings into another, so the settings in ``choose``
default to ``None`` and are filled by rules that read a profile of the training data (documents, labels,
lengths); ``layout`` fills where the run writes. What a config or the command line sets is never
changed. Training length is not a rule: training stops when the validation loss stops improving.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from han.segment import LanguageError, check_language
from training.hashed_ngrams import BUCKETS
from training.self_training import teaching
from training.sources import DataError, csv_label_lists, load_source
from training.word_vectors import AUTO, BUILD, GLOVE, glove_installed, resolve_embed_dim

SHORT_TEXT_WORDS = 40  # median words a document under which the data counts as short texts
GLOVE_DIM = 50  # glove-6b-50d's dimension: a config that sets another embed_dim keeps word2vec
FEW_LABELS = 3_000  # labelled training documents under which the data counts as few labels
ADVERSARIAL = 0.02  # the adversarial move for few labels, as a share of the word vectors' size
NGRAM_TEACHER = 0.3  # for few labels, the share of a training target from the cross-fitted n-gram baseline
# Training documents from which the n-gram baseline and head hash their 1-2 grams (training.hashed_ngrams)
# rather than keep a vocabulary: below, the vocabulary is the smaller table (405,723 n-grams at 22,500 IMDB
# reviews against 513,109 kept buckets) and scored as well or a little higher on the suite's small
# validation splits; above, it outgrows the fixed table (744,000 n-grams at 50,000 reviews, 7.4 GB to fit
# at 100,000 documents), where the hashed baseline was level (docs/experiments.md).
HASHED_FROM = 20_000
PLAIN_DDP = ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook")  # Lightning names each with _find_unused_parameters_true


@dataclass(frozen=True)
class DataProfile:
    """What the rules read: the training split's size and lengths (words are whitespace-separated)."""

    documents: int  # documents the network trains on (after validation is held out)
    labels: int
    multi_label: bool
    median_words: float
    total_words: int

    @property
    def short_texts(self) -> bool:
        return self.median_words < SHORT_TEXT_WORDS

    @property
    def few_labels(self) -> bool:
        return self.documents < FEW_LABELS

    def describe(self) -> str:
        task = "multi-label" if self.multi_label else "single-label"
        return (f"{self.documents:,} training documents, {self.labels} labels ({task}), "
                f"median {self.median_words:.0f} words, {self.total_words:,} words in all")


def profile(train: str, text_column: str, label_column: str, multi_label: bool | None, val_fraction: float,
            has_validation: bool, max_train_docs: int | None) -> DataProfile:
    """The profile of the training data: one pass over its text column."""
    raw = load_source(train)
    for column in (text_column, label_column):
        if column not in raw.column_names:
            raise DataError(f"train ({train}): no column {column!r}; its columns are {', '.join(raw.column_names)} "
                            f"(set data.text_column / data.label_column)")
    if max_train_docs is not None:
        raw = raw.select(range(min(max_train_docs, len(raw))))
    if multi_label is not False:  # a CSV whose label cells are lists (["a", "b"], ['a', 'b']) is multi-label
        raw = csv_label_lists(raw, train, label_column)
    table = raw.with_format("arrow")[:]
    labels = table.column(label_column)
    if isinstance(labels.type, pa.BaseExtensionType):  # values of several kinds, which datasets keeps as JSON
        raise DataError(_mixed_labels(train, label_column, raw[label_column]))
    is_list = pa.types.is_list(labels.type) or pa.types.is_large_list(labels.type)
    multi = is_list if multi_label is None else multi_label
    values = pc.list_flatten(labels) if is_list else labels
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = pc.utf8_normalize(values, "NFC")  # as a fit reads them (training.tokenise.label_strings)
    distinct = len(pc.unique(values.drop_null()))
    words = _word_counts(table.column(text_column))
    fit = len(raw) if has_validation else len(raw) - math.ceil(len(raw) * val_fraction)
    return DataProfile(documents=max(1, fit), labels=distinct, multi_label=bool(multi),
                       median_words=float(np.median(words)) if len(words) else 0.0, total_words=int(words.sum()))


def _mixed_labels(train: str, column: str, values: list) -> str:
    """Where a label column first changes kind (a list among strings, an object among numbers)."""
    kind = lambda v: "a list" if isinstance(v, list) else "an object" if isinstance(v, dict) else "a single label"  # noqa: E731
    first = next((v for v in values if v is not None), None)
    row = next((i for i, v in enumerate(values) if v is not None and kind(v) != kind(first)), None)
    where = f"row {row} holds {kind(values[row])} where the rows before hold {kind(first)}" if row is not None \
        else "its values are of several kinds"
    return (f"train ({train}) {where} in the label column {column!r}: give every row a single label (a string or "
            "an integer), or every row a list of labels (multi-label)")


def ngram_buckets(documents: int) -> int:
    """The n-gram table for a training split of ``documents``: 0 (a vocabulary) or ``BUCKETS`` hashed."""
    return 0 if documents < HASHED_FROM else BUCKETS


def choose(p: DataProfile, batch_size: int | None = None, scheduler: str = "plateau") -> dict[str, Any]:
    """The recipe's value for every setting it owns, keyed by the dotted name a config uses."""
    # Small batches for small data (more updates), but at least about 20 of them an epoch.
    batch = batch_size or (64 if p.documents >= 12_000 else min(32, max(8, p.documents // 20)))
    steps = math.ceil(p.documents / batch)  # optimiser steps per epoch
    # Fixed word vectors for the first ~300 steps while the encoders learn to read them (few documents:
    # several short epochs).
    freeze = min(8, math.ceil(300 / steps))
    choices: dict[str, Any] = {
        "data.batch_size": batch,
        # Few documents overfit sooner: more dropout. Long documents carry redundant words: word dropout.
        "model.dropout": 0.5 if p.documents < 3_000 else 0.4 if p.documents < 15_000 else 0.3,
        "model.word_dropout": 0.0 if p.median_words < 15 else 0.1 if p.median_words < 100 else 0.2,
        # Wider encoders pay off with many classes and enough documents to fill them (20 Newsgroups).
        "model.word_hidden": 100 if p.labels >= 10 and p.documents >= 8_000 else 50,
        "model.sentence_hidden": 100 if p.labels >= 10 and p.documents >= 8_000 else 50,
        "model.label_smoothing": 0.1 if p.labels >= 10 and not p.multi_label else 0.0,
        # gensim's 5 passes are made for large corpora: about 20 million words seen in all.
        "model.word2vec_epochs": int(min(30, max(5, math.ceil(20e6 / max(p.total_words, 1))))),
        "model.freeze_embeddings": freeze,
        # Few labels: each step also learns from adversarially moved word vectors (training.adversarial),
        # at twice its cost. On the suite's three few-label validation splits the HAN alone got 435 of
        # 500 right against 421 without it, and the same 435 with the word encoder pre-trained too
        # (training.pretrain); the model 456 against 450 in each of the other two: the recipe leaves the
        # pre-training off (docs/experiments.md).
        "model.adversarial": ADVERSARIAL if p.few_labels else 0.0,
        "model.pretrain_epochs": 0,
        # Few single-label documents: each target is also 30% the TF-IDF baseline's scores for the document,
        # fitted on the other folds (training.ngram_teacher): on 3,000 left-out training documents the
        # HAN alone gained about a point on IMDB at 1,000 labels, three seeds (docs/experiments.md).
        "data.ngram_teacher": NGRAM_TEACHER if p.few_labels and not p.multi_label else 0.0,
        # A moving average of the weights over about two epochs (at most 1,000 steps): the validation
        # score early stopping reads, and the model exported, are steadier than the last step's.
        "model.ema": round(min(0.999, max(0.99, 1 - 1 / (2 * steps))), 4),
        # The n-gram baseline's and head's table: a vocabulary under HASHED_FROM documents, else hashed.
        "export.ngram_buckets": ngram_buckets(p.documents),
    }
    if scheduler == "plateau":
        choices |= {
            "model.warmup_steps": min(150, steps),
            # Validations without a lower loss before stopping: more on small, noisy validation splits.
            "model.patience": 3 if p.documents >= 10_000 else 5,
            # The budget: early stopping ends most runs well before it.
            "trainer.max_epochs": int(min(100, max(15, math.ceil(12_000 / steps)))),
            # Past the vectors' release, and at least ~200 steps whatever the validation says.
            "trainer.min_epochs": max(freeze + 1, math.ceil(200 / steps)),
        }
    else:  # a schedule fixed in advance needs its length: about 3,000 steps
        choices["trainer.max_epochs"] = int(min(40, max(3, math.ceil(3_000 / steps))))
    return choices


def vectors(p: DataProfile, language: str, embed_dim: int | None) -> str:
    """The word vectors a fit starts from: public ones (GloVe 6B 50d, where its package is installed) for
    short English texts, which give word2vec too few words; else word2vec built from the data (on longer
    documents the two were level on the suite's validation splits)."""
    if p.short_texts and language == "en" and embed_dim in (None, GLOVE_DIM) and glove_installed():
        return GLOVE
    return BUILD


def advice(p: DataProfile, embeddings: str | None, unlabeled: str | None, language: str = "en",
           self_trains: bool = False) -> list[str]:
    """Lines the log prints for data where the recipe alone is known to fall short."""
    lines = []
    pretrained = embeddings not in (None, BUILD)
    if p.short_texts and not pretrained:
        public = ("pip install -e '.[glove]' and --model.embeddings glove-6b-50d, or a vectors file of yours"
                  if language == "en" else f"--model.embeddings with a vectors file in {language!r}, such as "
                  f"fastText's cc.{language}.300.vec (157 languages)")
        lines.append("short texts: word vectors built from this data carry little; public vectors do better: " + public)
    if p.few_labels and not p.short_texts and not self_trains:
        more = ("self-training on your unlabelled text (--self_training.fraction 1)" if unlabeled
                else "unlabelled text of the same kind (--data.unlabeled: self-training reads it)")
        lines.append("few labelled documents: TF-IDF + logistic regression is hard to beat here; the export averages "
                     "the HAN with it (an n-gram head) when that scores better on validation; more labels"
                     + ("" if p.multi_label else f", or {more},") + " improve the HAN itself")
    return lines


def apply(config: Any, subcommand: str = "fit") -> list[str]:
    """Fills the unset settings of a parsed ``han-train`` config; returns the log lines saying what and why.
    Outside ``fit``, only what reading the data and a checkpoint needs, silently."""
    data, model, trainer = config.data, config.model, config.trainer
    language = getattr(data, "language", "en")
    try:  # an unknown language code, or its tokenizer's package missing, stops the run before any work
        check_language(language)
    except LanguageError as e:
        raise DataError(f"data.language: {e}") from None
    p = profile(data.train, data.text_column, data.label_column, data.multi_label, data.val_fraction,
                bool(data.validation), data.max_train_docs)
    if data.multi_label is None:
        data.multi_label = p.multi_label
    # The best checkpoint (the one exported) by what the schedule watches: the validation loss with early
    # stopping, the score otherwise; a monitor given without its mode gets the one it needs.
    checkpoint = config.checkpoint
    if checkpoint.monitor is None:
        checkpoint.monitor = "val/loss" if model.scheduler == "plateau" else "val/score"
    checkpoint.mode = "min" if checkpoint.monitor.endswith("loss") else "max"
    filled = []
    if model.embeddings == AUTO and not model.init_from:
        model.embeddings = vectors(p, language, model.embed_dim)
        filled.append(f"model.embeddings={model.embeddings}")
    if model.embed_dim is None and not model.init_from:  # the vectors' dimension, written down for checkpoints
        model.embed_dim = resolve_embed_dim(None, model.embeddings)
        filled.append(f"model.embed_dim={model.embed_dim}")
    elif subcommand == "fit" and model.embed_dim is not None and not model.init_from and model.embeddings:
        resolve_embed_dim(model.embed_dim, model.embeddings)  # a mismatch stops here, before any training
    if subcommand != "fit":
        data.batch_size = data.batch_size or choose(p)["data.batch_size"]
        return []
    callbacks = [str(c.get("class_path", "")) for c in trainer.callbacks or []]
    if model.ema is None and any(c.endswith("EMA") or c.endswith("EMAWeightAveraging") for c in callbacks):
        model.ema = 0.0  # the config brings its own average
    unlabeled_docs = 0
    if data.unlabeled:  # word2vec also reads the unlabelled text: its passes count its words too
        unlabeled_docs, words = _size(data.unlabeled, data.text_column)
        p = replace(p, total_words=p.total_words + words)
    self_training = getattr(config, "self_training", None)
    if self_training is not None and self_training.fraction is None:
        # Unlabelled text given with few labels is read by a second fit, not only by word2vec.
        self_training.fraction = 1.0 if unlabeled_docs and p.few_labels and not p.multi_label else 0.0
        filled.append(f"self_training.fraction={self_training.fraction}")
    self_trains = bool(self_training is not None and self_training.fraction and unlabeled_docs)
    # Self-training's second fit keeps the rules of the labelled data (dropout, frozen vectors, epochs),
    # not those of its larger split: on 2,000 labels they scored 0.92 and 0.895 on validation against
    # 0.905 and 0.88 (IMDB, 20 Newsgroups; docs/experiments.md), though they take longer.
    chosen = choose(p, data.batch_size, model.scheduler)
    if trainer.max_epochs is not None:  # a length fixed by the config: the vectors fixed for a third of it at most
        chosen["model.freeze_embeddings"] = min(chosen["model.freeze_embeddings"], max(1, trainer.max_epochs // 3))
    if model.embeddings != BUILD or model.init_from:
        del chosen["model.word2vec_epochs"]  # no word2vec is built
    if self_trains:  # measured without them
        chosen["model.adversarial"] = chosen["data.ngram_teacher"] = 0.0
    for name, value in chosen.items():
        section, key = name.split(".")
        target = {"data": data, "model": model, "trainer": trainer, "export": config.export}[section]
        if getattr(target, key) is None:
            setattr(target, key, value)
            filled.append(f"{name}={value}")
    if trainer.min_epochs is not None and trainer.max_epochs is not None:
        trainer.min_epochs = min(trainer.min_epochs, trainer.max_epochs)
    lines = [f"recipe (training/recipe.py) for {p.describe()}:"]
    lines.append("  chosen: " + (", ".join(filled) if filled else "nothing (the config sets every setting)"))
    if model.embeddings == GLOVE and "model.embeddings=" + GLOVE in filled:
        lines.append(f"  vectors: {GLOVE}, public vectors for short English texts (--model.embeddings word2vec "
                     "builds them from this data instead)")
    if model.scheduler == "plateau":
        lines.append(f"  training length: until {model.patience} validations pass without a lower validation loss "
                     f"(the lowest is exported), the learning rate halved when it stalls, stopping at 1/16 of "
                     f"it, at most {trainer.max_epochs} epochs")
    if self_trains and not data.pseudo_labelled:  # the first fit says what the second will cost
        more = min(round(self_training.fraction * unlabeled_docs), self_training.max_documents)
        lines.append(f"  self-training: this first fit's model labels your {unlabeled_docs:,} unlabelled documents "
                     "(less any a labelled split also holds), "
                     f"then a second fit trains on the {p.documents:,} labelled plus up to {more:,} of them "
                     f"({self_training.targets} targets): the run takes up to about {2 + more / p.documents:.1f}x "
                     "a fit on the labels alone (--self_training.fraction 0 skips it)")
    lines += [f"  advice: {line}" for line in advice(p, model.embeddings, data.unlabeled, language, self_trains)]
    return lines


def layout(config: Any, subcommand: str) -> None:
    """Fills where the run writes and what it registers as, named after its last config file or its
    data; a self-training run's first fit (the teacher) goes to ``<run>/teacher``, unregistered."""
    trainer, checkpoint, export = config.trainer, config.checkpoint, config.export
    if trainer.strategy in PLAIN_DDP and config.model.freeze_embeddings != 0:
        # The fixed word vectors take no gradient, which plain DDP refuses as an unused parameter;
        # once released they must still be averaged across ranks, so they stay in DDP's reducer.
        trainer.strategy += "_find_unused_parameters_true"
    configs = config.get("config") or []
    run_name = Path(str(configs[-1])).stem if configs else _data_name(str(config.data.train))
    root = Path(trainer.default_root_dir or Path("runs") / run_name)
    if subcommand == "fit" and teaching(config):
        if config.data.multi_label:
            raise DataError("self-training (self_training.fraction above 0) is for single-label data")
        root = root / "teacher"  # its model only labels the unlabelled text (training.cli.main)
        checkpoint.dirpath = None
        # Unregistered and unmeasured, but with its n-gram head where validation keeps one: the averaged
        # scores are the more accurate teacher.
        export.register, export.faithfulness = False, 0
        export.output_dir = None  # the teacher's model goes to <run>/teacher/model; --export.output_dir is the second's
        config.data.test = None  # only the exported model is read on test
    trainer.default_root_dir = str(root)
    if checkpoint.dirpath is None:
        checkpoint.dirpath = str(root / "checkpoints")
    if export.name is None:
        export.name = f"han-{run_name}"
    if trainer.enable_progress_bar is False:
        trainer.callbacks = [c for c in trainer.callbacks or []
                             if not str(c.get("class_path", "")).endswith("ProgressBar")]
    if trainer.logger in (None, True):
        trainer.logger = [{"class_path": f"pytorch_lightning.loggers.{kind}Logger",
                           "init_args": {"save_dir": str(root), "name": kind.lower()}}
                          for kind in ("CSV", "TensorBoard")]


def _data_name(source: str) -> str:
    """A run without a config is named after its training data (runs/my_reviews, han-my_reviews): the
    file's stem, or its folder's name where the stem says nothing (train.parquet), in the characters a
    BentoML tag allows."""
    path = Path(source.split(":")[0])
    name = path.parent.name if path.stem.lower() in {"train", "training", "data", "dataset"} else path.stem
    return re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-.") or "han"


def _size(source: str, text_column: str) -> tuple[int, int]:
    """Documents and whitespace-separated words in a source's text column."""
    raw = load_source(source)
    if text_column not in raw.column_names:
        return 0, 0  # the data module names the missing column when it reads the text
    return len(raw), int(_word_counts(raw.with_format("arrow")[:].column(text_column)).sum())


def _word_counts(text: pa.ChunkedArray, rows: int = 10_000) -> np.ndarray:
    """Words of each document: whitespace-separated chunks, plus a word per Chinese, Japanese or Thai
    character, as those scripts run words together and their tokenizers split them (a missing text
    counts none). ``rows`` documents at a time: splitting a whole corpus at once would hold every word
    of it in memory (about 2.5 KB a document)."""
    parts = [_slice_word_counts(text.slice(start, rows)) for start in range(0, len(text), rows)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _slice_word_counts(text: pa.ChunkedArray) -> np.ndarray:
    if not pa.types.is_string(text.type) and not pa.types.is_large_string(text.type):
        text = pc.cast(text, pa.string())
    text = text.fill_null("")
    text = pc.utf8_trim_whitespace(text)
    chunks = pc.list_value_length(pc.utf8_split_whitespace(text)).to_numpy(zero_copy_only=False)
    chunks = np.where(pc.equal(text, "").to_numpy(zero_copy_only=False), 0, chunks)  # "" splits into [""]
    unspaced = pc.count_substring_regex(text, r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}]")
    return chunks + unspaced.to_numpy(zero_copy_only=False)
