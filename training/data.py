"""The LightningDataModule: load, validate, tokenise (cached on disk), build the vocabulary, batch by length."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Sampler

from han.segment import SegmenterConfig, has_words
from han.vocab import Vocabulary
from training import ngram_teacher, tokenise
from training.batches import EncodedDocuments, FlatWriter, LabelledTexts, LengthBucketSampler, collate_examples
from training.self_training import soft_targets
from training.sources import DataError, csv_label_lists, load_source, refuse_missing_values
from training.splits import stable_holdout

SPLIT_COLUMN = "split"  # a training file's rows marked validation here are the validation split
TOKENISER_VERSION = 4  # bump when segmentation or the cached columns change, to invalidate caches
COUNT_CHUNK = 1 << 22  # word ids counted at a time: np.bincount widens its input to 64 bits


class HANDataModule(pl.LightningDataModule):
    """Labelled documents for a HAN.

    Args:
        train: training data: a .parquet/.csv/.jsonl file, a folder with one sub-folder of .txt
            files per class, or a Hugging Face dataset name (``name:split``).
        validation: validation data; when omitted, ``val_fraction`` of train is held out
            (stratified by label, seeded).
        test: test data, used by ``han-train test`` and the evaluation report after ``fit``.
        unlabeled: more text in any of the same formats, with or without a label column: word vectors
            built with ``--model.embeddings word2vec`` learn from it as well as from train, and
            self-training (``--self_training.fraction``) labels some of it.
        pseudo_labelled: documents labelled by an earlier model (self-training writes them): added to
            the training split only, after validation is held out, so validation and test stay
            human-labelled.
        ngram_teacher: the share of each human-labelled training document's target taken from the
            TF-IDF baseline's scores for it, fitted on the other four fifths of the training split
            (fewer folds when a class has under five documents; training.ngram_teacher), the rest from
            its label; under 0.5, so the label stays the target's top class; single-label data only.
            Unset: 0 (``han-train`` fills it: training.recipe).
        text_column: the column holding the document text.
        label_column: the column holding the label (string or integer), or a list of labels when
            ``multi_label`` is true.
        multi_label: each document has any number of labels (``han-train`` sets it from the data when
            unset: a label column of lists; built directly, unset is single-label).
        labels: the label names in a fixed order; by default the sorted labels seen in train.
        val_fraction: the share of train held out for validation when ``validation`` is not given (rows
            of train whose ``split`` column is ``validation``, as han-label marks them, are held out instead).
        seed: seed for the validation split and batch order.
        batch_size: documents per training batch (by default from the data's size: training.recipe; 64
            when the module is built directly).
        eval_batch_size: documents per validation/test batch.
        min_freq: words seen fewer times in train become unknown.
        max_vocab: the vocabulary's size cap, padding and unknown included.
        max_sentences: cap on sentences per document (longer documents are truncated).
        max_words: cap on words per sentence (longer sentences are split).
        max_chars: cap on characters read per document.
        language: the documents' language, a spaCy code (en, de, fr, es, zh, ...): its tokenizer's rules
            segment them, here and wherever the model is used (it is saved with the model).
        max_train_docs: use only the first N training documents (quick runs).
        max_eval_docs: use only the first N validation and test documents (quick runs).
        cache_dir: where tokenised splits are cached; a second run over the same file reuses them.
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        train: str,
        validation: str | None = None,
        test: str | None = None,
        unlabeled: str | None = None,
        pseudo_labelled: str | None = None,
        ngram_teacher: float | None = None,
        text_column: str = "text",
        label_column: str = "label",
        multi_label: bool | None = None,
        labels: list[str] | None = None,
        val_fraction: float = 0.1,
        seed: int = 42,
        batch_size: int | None = None,
        eval_batch_size: int = 256,
        min_freq: int = 2,
        max_vocab: int = 50_000,
        max_sentences: int = 50,
        max_words: int = 60,
        max_chars: int = 100_000,
        language: str = "en",
        max_train_docs: int | None = None,
        max_eval_docs: int | None = None,
        cache_dir: str = ".cache/han",
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        batch_size = 64 if batch_size is None else batch_size
        if not 0 < val_fraction < 1:
            raise DataError(f"data.val_fraction must be between 0 and 1 (exclusive), not {val_fraction}")
        if not 0 <= (ngram_teacher or 0) < 0.5:
            raise DataError(f"data.ngram_teacher must be at least 0 and under 0.5, not {ngram_teacher}")
        for name, value in [("batch_size", batch_size), ("eval_batch_size", eval_batch_size), ("min_freq", min_freq),
                            ("max_vocab", max_vocab), ("max_sentences", max_sentences), ("max_words", max_words),
                            ("max_chars", max_chars)]:
            if value < 1:
                raise DataError(f"data.{name} must be at least 1, not {value}")
        self.save_hyperparameters()
        self.segmenter_config = SegmenterConfig(max_sentences=max_sentences, max_words=max_words, max_chars=max_chars,
                                                language=language)
        self.vocab: Vocabulary | None = None
        self.label_names: list[str] | None = labels
        self.splits: dict[str, EncodedDocuments | LabelledTexts] = {}
        self._keys: dict[str, datasets.Dataset] = {}
        self.cache_keys: dict[str, str] = {}  # split -> key of its tokenisation cache
        self._unlabeled: datasets.Dataset | None = None
        self.pseudo_labelled_rows = 0  # the training split's last rows, labelled by a model (self-training)

    # -- public facts, available after setup() -------------------------------------------------
    @property
    def num_labels(self) -> int:
        self.setup()
        assert self.label_names is not None
        return len(self.label_names)

    @property
    def multi_label(self) -> bool:
        return bool(self.hparams.multi_label)

    @property
    def vocab_size(self) -> int:
        self.setup()
        assert self.vocab is not None
        return len(self.vocab)

    def sentences(self) -> Iterator[list[str]]:
        """Every sentence (its token keys) of the training split, then of the unlabelled text: the corpus
        word vectors are built from. Tokenises the unlabelled text (cached) on first use."""
        for split in (self.split_keys("train"), self.unlabeled_keys()):
            if split is not None:
                for document in self._iter_keys(split):
                    yield from document

    def split_keys(self, split: str) -> datasets.Dataset:
        self.setup()
        return self._keys[split]

    def unlabeled_keys(self) -> datasets.Dataset | None:
        """The unlabelled text, tokenised (and cached) on first use; None without ``unlabeled``."""
        if self.hparams.unlabeled and self._unlabeled is None:
            self._unlabeled = self._tokenised("unlabeled", self.hparams.unlabeled, None)
        return self._unlabeled

    def token_counts(self) -> np.ndarray:
        """How often each vocabulary id occurs in the training split."""
        self.setup()
        assert self.vocab is not None
        ids, counts = self.splits["train"].ids, np.zeros(len(self.vocab), dtype=np.int64)
        for start in range(0, len(ids), COUNT_CHUNK):  # whole, 8 bytes a training word (1.5 GB at 1M documents)
            counts += np.bincount(ids[start : start + COUNT_CHUNK], minlength=len(self.vocab))
        return counts

    def texts(self, split: str) -> list[str]:
        """The split's documents as text, in order (those with no words left out, as in training):
        evaluation and ``han-train predict`` run them through the inference pipeline."""
        self.setup()
        return self._keys[split]["text"]

    def rows(self, split: str) -> list[int]:
        """Each of ``texts``' documents' row in its file (counted from 0; a validation split carved from the
        training file: the training file's rows)."""
        self.setup()
        return self._keys[split]["row"]

    # -- Lightning hooks -------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.vocab is not None:
            return
        hp = self.hparams
        train = self._tokenised("train", hp.train, hp.max_train_docs)
        self.label_names = self.label_names or self._collect_labels(train)
        if len(self.label_names) < 2:
            raise DataError(
                f"train ({hp.train}): the label column {hp.label_column!r} has only one class "
                f"({self.label_names[0]!r}); a classifier needs at least two"
            )
        if hp.validation:
            val = self._tokenised("validation", hp.validation, hp.max_eval_docs)
        else:
            train, val = self._carve_validation(train)
        if hp.pseudo_labelled:
            pseudo = self._tokenised("pseudo_labelled", hp.pseudo_labelled, None)
            train = datasets.concatenate_datasets([train, pseudo])
            self.pseudo_labelled_rows = len(pseudo)
        self._keys = {"train": train, "validation": val}
        self.vocab = Vocabulary.build(self._iter_keys(train), min_freq=hp.min_freq, max_size=hp.max_vocab)
        self.splits = {name: self._encode(name, ds) for name, ds in self._keys.items()}
        if self.pseudo_labelled_rows and not self.multi_label:  # the teacher's scores, when it wrote them
            rows = self.pseudo_labelled_rows
            soft = soft_targets(hp.pseudo_labelled, train["text"][-rows:], hp.text_column, self.label_names)
            if soft is not None:
                human = torch.nn.functional.one_hot(self.splits["train"].targets[:-rows], len(self.label_names))
                self.splits["train"].targets = torch.cat([human.float(), soft])
        if hp.ngram_teacher and self.multi_label:
            raise DataError("data.ngram_teacher is for single-label data (set it to 0)")
        if hp.ngram_teacher:
            human = len(train) - self.pseudo_labelled_rows
            self.splits["train"].targets = ngram_teacher.mixed_targets(
                train["text"][:human], self.splits["train"].targets, len(self.label_names), hp.ngram_teacher, hp.seed)
        if hp.test:
            self._keys["test"] = self._texts("test", hp.test, hp.max_eval_docs)
            self.splits["test"] = LabelledTexts(self._targets("test", self._keys["test"]["target"],
                                                              self._keys["test"]))

    def train_dataloader(self) -> DataLoader:
        data = self.splits["train"]
        sampler = LengthBucketSampler(data.sizes, self.hparams.batch_size, shuffle=True, seed=self.hparams.seed)
        return self._loader(data, sampler)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("validation")

    def test_dataloader(self) -> DataLoader:
        if "test" not in self.splits:
            raise DataError("no test data: set data.test in the config or with --data.test PATH")
        if isinstance(self.splits["test"], LabelledTexts):  # tokenised now: Lightning's test loop reads tokens
            self._keys["test"] = self._tokenised("test", self.hparams.test, self.hparams.max_eval_docs)
            self.splits["test"] = self._encode("test", self._keys["test"])
        return self._eval_loader("test")

    @property
    def predict_split(self) -> str:
        """What ``han-train predict`` scores: the test split, else validation."""
        self.setup()
        return "test" if "test" in self.splits else "validation"

    def predict_dataloader(self) -> DataLoader:
        # The split's texts in input order, so that predictions line up with the file's rows; the
        # module runs each batch through the inference pipeline.
        return DataLoader(self.texts(self.predict_split), batch_size=self.hparams.eval_batch_size, collate_fn=list)

    def _eval_loader(self, split: str) -> DataLoader:
        data = self.splits[split]
        return self._loader(data, LengthBucketSampler(data.sizes, self.hparams.eval_batch_size, shuffle=False))

    def _loader(self, data: EncodedDocuments, sampler: Sampler) -> DataLoader:
        workers = self.hparams.num_workers
        return DataLoader(
            data, batch_sampler=sampler, collate_fn=collate_examples, num_workers=workers,
            persistent_workers=workers > 0,
        )

    # -- loading and tokenising ------------------------------------------------------------------
    def _tokenised(self, split: str, source: str, limit: int | None) -> datasets.Dataset:
        """The split tokenised (columns text, keys and target), cached on disk. Unlabelled text
        (``split == "unlabeled"``) needs no label column; its targets are empty."""
        hp = self.hparams
        labelled = split != "unlabeled"
        raw = self._raw(split, source, limit, labelled)
        key = self._cache_key(source, raw, limit)
        self.cache_keys[split] = key
        cache = Path(hp.cache_dir) / f"{split}-{key}.arrow"
        cache.parent.mkdir(parents=True, exist_ok=True)
        result = raw.map(
            tokenise.tokenise_batch, batched=True, batch_size=1000, with_indices=True, remove_columns=raw.column_names,
            fn_kwargs={"split": split, "source": source, "text_column": hp.text_column,
                       "label_column": hp.label_column if labelled else None, "multi_label": self.multi_label,
                       "config": self.segmenter_config},
            num_proc=tokenise.processes(len(raw)),
            cache_file_name=str(cache), load_from_cache_file=True, new_fingerprint=key, desc=f"Tokenising {split}",
        )
        if len(result) == 0:
            raise DataError(f"{split} ({source}): no non-empty documents")
        tokenise.report_wordless(split, source, len(raw), result.with_format("numpy")["row"])
        return result

    def _raw(self, split: str, source: str, limit: int | None, labelled: bool) -> datasets.Dataset:
        """The split's text and label columns, checked for missing columns and values."""
        hp = self.hparams
        raw = load_source(source)
        needed = (hp.text_column, hp.label_column) if labelled else (hp.text_column,)
        missing = [c for c in needed if c not in raw.column_names]
        if missing:
            raise DataError(
                f"{split} ({source}): no column {missing[0]!r}; its columns are {', '.join(raw.column_names)} "
                f"(set data.text_column / data.label_column)"
            )
        if limit is not None:
            raw = raw.select(range(min(limit, len(raw))))
        raw = raw.select_columns(list(needed))
        if labelled and self.multi_label:  # a CSV's lists, as han-score and pandas write them
            raw = csv_label_lists(raw, source, hp.label_column)
        refuse_missing_values(raw, split, source, hp.text_column, hp.label_column if labelled else None,
                               "a list" if self.multi_label else "a string or an integer")
        return raw

    def _texts(self, split: str, source: str, limit: int | None) -> datasets.Dataset:
        """The split as ``_tokenised`` gives it (the same rows: those with a word), without its tokens."""
        hp = self.hparams
        raw = self._raw(split, source, limit, labelled=True)
        kept: dict[str, list] = {"text": [], "target": [], "row": []}
        start = 0  # the file's row of the batch's first (rows without a word are skipped, not renumbered)
        for rows in raw.iter(batch_size=2000):
            texts = rows[hp.text_column]
            for i, (text, label) in enumerate(zip(texts, rows[hp.label_column], strict=True), start):
                if has_words(tokenise.require_text(text, i, split, source), hp.max_chars):
                    kept["text"].append(text)
                    kept["target"].append(tokenise.label_strings(label, self.multi_label, split, source, i))
                    kept["row"].append(i)
            start += len(texts)
        if not kept["text"]:
            raise DataError(f"{split} ({source}): no non-empty documents")
        tokenise.report_wordless(split, source, len(raw), kept["row"])
        return datasets.Dataset.from_dict(kept)

    def _cache_key(self, source: str, raw: datasets.Dataset, limit: int | None) -> str:
        path = Path(source)
        if path.is_file():
            stat = path.stat()
            identity: Any = [str(path.resolve()), stat.st_size, stat.st_mtime_ns]
        elif path.is_dir():
            identity = [str(path.resolve()), raw._fingerprint]
        else:
            identity = [source, raw._fingerprint]
        hp = self.hparams
        payload = [identity, limit, hp.text_column, hp.label_column, self.multi_label,
                   self.segmenter_config.to_dict(), TOKENISER_VERSION]
        return hashlib.sha256(json.dumps(payload, default=str).encode()).hexdigest()[:16]

    def _collect_labels(self, train: datasets.Dataset) -> list[str]:
        return tokenise.label_order({label for target in train["target"] for label in target})

    def _carve_validation(self, train: datasets.Dataset) -> tuple[datasets.Dataset, datasets.Dataset]:
        marked = self._marked_validation()
        if marked:  # the rows the file marks (han-label next's random holdout), if they leave rows to train on
            texts = train["text"]
            val = [i for i, text in enumerate(texts) if text in marked]
            if 0 < len(val) < len(texts):
                held = set(val)
                return train.select([i for i in range(len(texts)) if i not in held]), train.select(val)
        classes = None if self.multi_label else [t[0] for t in train["target"]]
        fit, val = stable_holdout(train["text"], classes, self.hparams.val_fraction, self.hparams.seed)
        return train.select(fit), train.select(val)

    def _marked_validation(self) -> set[str]:
        """The texts of the training file's rows whose ``split`` column says ``validation``: a labelled set
        chosen by uncertainty holds the model's hardest documents, and han-label next marks a random share
        of each round to validate on instead (docs/labeling.md)."""
        hp = self.hparams
        raw = load_source(hp.train)
        if SPLIT_COLUMN not in raw.column_names:
            return set()
        if hp.max_train_docs is not None:
            raw = raw.select(range(min(hp.max_train_docs, len(raw))))
        rows = raw.select_columns([hp.text_column, SPLIT_COLUMN])
        return {text for text, split in zip(rows[hp.text_column], rows[SPLIT_COLUMN], strict=True)
                if split == "validation" and isinstance(text, str)}

    @staticmethod
    def _iter_keys(ds: datasets.Dataset) -> Iterator[list[list[str]]]:
        for batch in ds.select_columns(["keys"]).iter(batch_size=2000):
            yield from batch["keys"]

    def _encode(self, split: str, ds: datasets.Dataset) -> EncodedDocuments:
        assert self.vocab is not None
        encode = self.vocab.encode
        # on disk beside the tokenisation cache, read memory-mapped: a split's size is not the process's
        writer = FlatWriter(self.hparams.cache_dir)
        for batch in ds.select_columns(["keys"]).iter(batch_size=2000):
            for keys in batch["keys"]:
                writer.add(np.fromiter((i for sentence in keys for i in encode(sentence)), dtype=np.int32),
                           np.fromiter(map(len, keys), dtype=np.int32))
        return writer.documents(self._targets(split, ds["target"], ds))

    def _targets(self, split: str, labels: list[list[str]], ds: datasets.Dataset) -> torch.Tensor:
        """Class indices, or a 0/1 row per document for multi-label data; a label the training split lacks
        is named with its file and row (``ds``'s row column, read only then)."""
        assert self.label_names is not None
        index = {name: i for i, name in enumerate(self.label_names)}
        targets = (
            torch.zeros(len(labels), len(index)) if self.multi_label else torch.zeros(len(labels), dtype=torch.long)
        )
        for row, target in enumerate(labels):
            unknown = [t for t in target if t not in index]
            if unknown:
                hp = self.hparams
                source = {"test": hp.test, "validation": hp.validation or hp.train}.get(split, hp.train)
                raise DataError(f"{split} ({source}) row {ds[row]['row']}: label {unknown[0]!r} does not occur in the "
                                f"training labels ({', '.join(self.label_names)})")
            if self.multi_label:
                targets[row, [index[t] for t in target]] = 1.0
            else:
                targets[row] = index[target[0]]
        return targets

