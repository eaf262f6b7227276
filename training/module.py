"""The LightningModule: owns the optimisation of a HAN and its metrics."""

from __future__ import annotations

from typing import Any, Literal

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassF1Score,
    MultilabelAccuracy,
    MultilabelF1Score,
)

from han.batch import Batch
from han.model import HAN, HANConfig
from han.pipeline import Pipeline
from han.results import DocumentError, DocumentResult
from training.nb_features import feature_count, nb_ratios
from training.warm_start import ARCHITECTURE, load_stored, warm_start
from training.word_vectors import WORD2VEC, word_vectors


class HANClassifier(pl.LightningModule):
    """A HAN trained with AdamW or SGD (momentum), a learning-rate schedule and gradient clipping.

    ``vocab_size``, ``num_labels`` and ``multi_label`` come from the data: ``han-train`` links
    them from the DataModule (``link_arguments``), so a config never sets them.

    Args:
        vocab_size: the vocabulary's size (from the data).
        num_labels: the number of labels (from the data).
        multi_label: each document has any number of labels (from the data).
        embed_dim: word embedding size.
        word_hidden: GRU hidden size per direction over words.
        sentence_hidden: GRU hidden size per direction over sentences.
        attention_dim: size of the attention MLPs and context vectors.
        dropout: dropout before the classifier head.
        word_dropout: share of words replaced by the unknown token while training.
        optimizer: ``adamw`` or ``sgd`` (with Nesterov momentum).
        lr: peak learning rate.
        weight_decay: decoupled weight decay (AdamW) or L2 (SGD); not applied to embeddings or biases.
        momentum: SGD momentum.
        scheduler: ``onecycle`` (warm-up then cosine decay to ~0), ``cosine``, or ``constant``.
        warmup_fraction: share of steps spent warming up with ``onecycle``.
        grad_clip: clip the gradient norm to this value (0 disables).
        label_smoothing: share of each target spread over all labels (multi-label: each target moves
            this share towards 0.5); 0 disables.
        init_from: start from a stored model (a BentoML tag or a model directory) instead of from
            scratch; its sizes and sentence_values replace embed_dim, word_hidden, sentence_hidden,
            attention_dim and sentence_values (see ``training.warm_start``).
        embeddings: initialise the word embeddings from a vectors file (word2vec text or binary,
            GloVe, fastText .vec, gensim KeyedVectors; its dimension must be embed_dim), or
            ``word2vec`` (the default, the paper's recipe) to build them here from the training text
            and ``data.unlabeled`` (``training.word_vectors``); null for random. Not used with
            ``init_from``, whose model brings its own vectors.
        word2vec_epochs: passes over the text when ``embeddings`` is ``word2vec`` (gensim's 5 suit
            large corpora; a few million words gain from more).
        freeze_embeddings: keep the initial vectors fixed for this many epochs (the new layers first
            learn to read them).
        nb_features: give the word encoder each word's Naive Bayes log-count ratios from the training
            data beside its embedding (``training.nb_features``).
        sentence_values: what the sentence attention averages into the document vector:
            ``contextual`` (the sentence BiGRU's states, as in Yang et al.) or ``own`` (each sentence's
            own vector, so that removing a sentence changes no other's; see ``han.HANConfig``).
    """

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        multi_label: bool = False,
        embed_dim: int = HANConfig.embed_dim,  # the network's defaults live in HANConfig alone
        word_hidden: int = HANConfig.word_hidden,
        sentence_hidden: int = HANConfig.sentence_hidden,
        attention_dim: int = HANConfig.attention_dim,
        dropout: float = HANConfig.dropout,
        word_dropout: float = HANConfig.word_dropout,
        optimizer: Literal["adamw", "sgd"] = "adamw",
        lr: float = 3e-3,
        weight_decay: float = 1e-4,
        momentum: float = 0.9,
        scheduler: Literal["onecycle", "cosine", "constant"] = "onecycle",
        warmup_fraction: float = 0.1,
        grad_clip: float = 5.0,
        label_smoothing: float = 0.0,
        init_from: str | None = None,
        embeddings: str | None = "word2vec",
        word2vec_epochs: int = WORD2VEC["epochs"],
        freeze_embeddings: int = 1,
        nb_features: bool = False,
        sentence_values: Literal["contextual", "own"] = "contextual",
    ) -> None:
        super().__init__()
        self._stored = None
        self._initialised = False
        if init_from:
            self._stored = load_stored(init_from)
            stored_sizes = {name: getattr(self._stored.model.config, name) for name in ARCHITECTURE}
            embed_dim, word_hidden, sentence_hidden, attention_dim = stored_sizes.values()
            sentence_values = self._stored.model.config.sentence_values
        if lr <= 0:
            raise ValueError(f"model.lr must be positive, not {lr}")
        if word2vec_epochs < 1:
            raise ValueError(f"model.word2vec_epochs must be at least 1, not {word2vec_epochs}")
        if freeze_embeddings < 0:
            raise ValueError(f"model.freeze_embeddings must be 0 or more, not {freeze_embeddings}")
        if not 0 <= dropout < 1 or not 0 <= word_dropout < 1:
            raise ValueError("model.dropout and model.word_dropout must be in [0, 1)")
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"model.label_smoothing must be in [0, 1), not {label_smoothing}")
        self.save_hyperparameters()
        self.net = HAN(HANConfig(
            vocab_size=vocab_size, num_labels=num_labels, multi_label=multi_label, embed_dim=embed_dim,
            word_hidden=word_hidden, sentence_hidden=sentence_hidden, attention_dim=attention_dim,
            dropout=dropout, word_dropout=word_dropout,
            nb_features=feature_count(num_labels, multi_label) if nb_features else 0, sentence_values=sentence_values,
        ))
        n = num_labels
        if multi_label:
            self.loss_fn: nn.Module = nn.BCEWithLogitsLoss()
            metrics = {
                "score": MultilabelF1Score(n, average="micro"),
                "micro_f1": MultilabelF1Score(n, average="micro"),
                "macro_f1": MultilabelF1Score(n, average="macro"),
                "acc": MultilabelAccuracy(n, average="micro"),
            }
        else:
            self.loss_fn = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
            metrics = {
                "score": MulticlassAccuracy(n, average="micro"),
                "acc": MulticlassAccuracy(n, average="micro"),
                "macro_f1": MulticlassF1Score(n, average="macro"),
            }
        collection = MetricCollection(metrics)
        self.train_metrics = collection.clone(prefix="train/")
        self.val_metrics = collection.clone(prefix="val/")
        self.test_metrics = collection.clone(prefix="test/")
        # ``han-train predict``: the exported model's pipeline, set by the export callback (which
        # owns the decision threshold) before the first batch.
        self.pipeline: Pipeline | None = None

    def setup(self, stage: str) -> None:
        # Before a checkpoint is restored (so --ckpt_path still wins), once the data's vocabulary exists:
        # vectors first, then a stored model's words and encoders over them.
        if stage != "fit" or self._initialised:
            return
        self._initialised = True
        data = self.trainer.datamodule
        if self.hparams.embeddings and self._stored is None:
            vectors = word_vectors(self.hparams.embeddings, data, self.net.config.embed_dim, data.hparams.seed,
                                   self.hparams.word2vec_epochs)
            with torch.no_grad():
                self.net.embedding.weight.copy_(torch.from_numpy(vectors.matrix))
            rank_zero_info(f"{vectors.source}: {vectors.coverage(data.token_counts())}")
        if self.net.config.nb_features:
            train = data.splits["train"]
            ratios = nb_ratios(train.documents, train.targets, len(data.vocab), self.net.config.multi_label)
            self.net.nb_ratios.copy_(torch.from_numpy(ratios))
        if self._stored is not None:
            rank_zero_info(warm_start(self.net, self._stored, data.vocab, list(data.label_names)))
            self._stored = None

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A checkpoint from before sentence_values existed was trained "contextual"; with equal hidden
        # sizes its head would also fit an "own" network, and load silently into the wrong one.
        stored = checkpoint.get("hyper_parameters", {}).get("sentence_values", "contextual")
        if stored != self.net.config.sentence_values:
            raise ValueError(f"the checkpoint was trained with model.sentence_values={stored}, this run has "
                             f"{self.net.config.sentence_values} (set --model.sentence_values {stored})")

    def on_train_epoch_start(self) -> None:
        self.net.embedding.weight.requires_grad_(self.current_epoch >= self.hparams.freeze_embeddings)

    # -- steps --------------------------------------------------------------------------------------
    def forward(self, batch: Batch) -> Tensor:
        return self.net(*batch).logits

    def _step(self, batch: tuple[Batch, Tensor], split: str) -> Tensor:
        inputs, target = batch
        logits = self(inputs)
        smoothing = self.hparams.label_smoothing
        if self.net.config.multi_label and smoothing and split == "train":
            loss = self.loss_fn(logits, target * (1 - smoothing) + smoothing / 2)
        else:
            loss = self.loss_fn(logits, target)
        preds = torch.sigmoid(logits) if self.net.config.multi_label else logits.argmax(-1)
        metric_target = target.long() if self.net.config.multi_label else target
        metrics = getattr(self, f"{split}_metrics")
        metrics.update(preds, metric_target)
        size = target.shape[0]
        self.log(f"{split}/loss", loss, prog_bar=split != "test", on_step=split == "train", on_epoch=True,
                 batch_size=size, sync_dist=split != "train")
        self.log_dict(metrics, on_step=False, on_epoch=True, prog_bar=split == "val", batch_size=size)
        return loss

    def training_step(self, batch: tuple[Batch, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: tuple[Batch, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: tuple[Batch, Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def predict_step(self, batch: list[str], batch_idx: int) -> list[DocumentResult | DocumentError]:
        """A batch of texts through the inference pipeline, the one every caller uses."""
        if self.pipeline is None:
            raise RuntimeError("han-train predict needs the export callback to set up the pipeline")
        return self.pipeline(batch)

    # -- optimisation ----------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        hp = self.hparams
        decay, no_decay = [], []
        for name, param in self.named_parameters():
            (no_decay if name.endswith("bias") or "embedding" in name or "context" in name else decay).append(param)
        groups = [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        if hp.optimizer == "sgd":
            optimizer = torch.optim.SGD(groups, lr=hp.lr, momentum=hp.momentum, nesterov=True)
        else:
            optimizer = torch.optim.AdamW(groups, lr=hp.lr, fused=True)
        if hp.scheduler == "constant":
            return optimizer
        total = max(1, int(self.trainer.estimated_stepping_batches))
        if hp.scheduler == "onecycle":
            schedule = torch.optim.lr_scheduler.OneCycleLR(
                optimizer, max_lr=hp.lr, total_steps=total, pct_start=hp.warmup_fraction,
                cycle_momentum=hp.optimizer == "sgd",
            )
        else:
            schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        clip = gradient_clip_val if gradient_clip_val is not None else self.hparams.grad_clip
        if clip:
            self.clip_gradients(optimizer, gradient_clip_val=clip, gradient_clip_algorithm="norm")
