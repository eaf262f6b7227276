"""Pre-training the word encoder on text without labels, before the labelled fit.

The word BiGRU's two directions are two language models (Dai & Le 2015; Howard & Ruder 2018): the
forward GRU's state after each word predicts the next word, the backward GRU's the word before. The
output layer scores the true word against words drawn from the unigram distribution to the power 0.75
(sampled softmax with the log-Q correction, Jean et al. 2015; a full softmax over the vocabulary is too
slow on a few cores), through the fixed input word vectors (tied output embeddings), so only the GRUs
and a projection learn. The text: the labelled training split and ``data.unlabeled``, never
validation or test. The encoder's weights are cached, keyed by the text's tokenisation caches, the
vocabulary and the settings, so a second fit over the same text reuses them.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pytorch_lightning.utilities import rank_zero_info
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from han.model import HAN
from training.progress import Step

NEGATIVES = 256  # sampled words scored against each true one
BATCH_WORDS = 8192  # words per step (sentences of similar length)
VERSION = 1


class _LanguageModels(nn.Module):
    """The two directions' output: a projection to the word vectors' space and a bias per word."""

    def __init__(self, net: HAN, noise: Tensor) -> None:
        super().__init__()
        hidden, dim = net.word_rnn.forward_rnn.hidden_size, net.config.embed_dim
        self.forward_out, self.backward_out = nn.Linear(hidden, dim), nn.Linear(hidden, dim)
        self.bias = nn.Parameter(torch.zeros(net.config.vocab_size))
        self.register_buffer("log_q", torch.log(noise * NEGATIVES + 1e-12))
        self.noise = noise

    def loss(self, states: Tensor, targets: Tensor, out: nn.Linear, vectors: Tensor) -> Tensor:
        """Sampled softmax of ``targets`` [n] given ``states`` [n, hidden]."""
        q = out(states)
        negatives = torch.multinomial(self.noise, NEGATIVES, replacement=True)
        true = (q * vectors[targets]).sum(-1) + self.bias[targets] - self.log_q[targets]
        sampled = q @ vectors[negatives].T + self.bias[negatives] - self.log_q[negatives]
        sampled = sampled.masked_fill(negatives[None, :] == targets[:, None], float("-inf"))  # accidental hits
        logits = torch.cat([true[:, None], sampled], 1)
        return nn.functional.cross_entropy(logits, torch.zeros_like(targets))


def _sentences(data: Any) -> list[np.ndarray]:
    """The sentences word2vec reads (the training split's, then the unlabelled text's) as word ids,
    two words or more."""
    encode = data.vocab.encode
    return [ids for ids in (np.asarray(encode(s), dtype=np.int64) for s in data.sentences()) if len(ids) >= 2]


def _batches(sentences: list[np.ndarray], rng: np.random.Generator) -> list[list[int]]:
    """Sentences of similar length, about BATCH_WORDS words a batch, in random order."""
    order = sorted(rng.permutation(len(sentences)).tolist(), key=lambda i: len(sentences[i]))
    batches, current, words = [], [], 0
    for i in order:
        current.append(i)
        words += len(sentences[i])
        if words >= BATCH_WORDS:
            batches.append(current)
            current, words = [], 0
    if current:
        batches.append(current)
    return [batches[i] for i in rng.permutation(len(batches))]


def _direction_loss(rnn: nn.GRU, out: nn.Linear, lm: _LanguageModels, vectors: Tensor, ids: Tensor,
                    lengths: Tensor) -> Tensor:
    """One direction over padded ``ids`` [rows, steps]: each state predicts the following word."""
    packed = nn.utils.rnn.pack_padded_sequence(vectors[ids], lengths, batch_first=True, enforce_sorted=False)
    states, _ = nn.utils.rnn.pad_packed_sequence(rnn(packed)[0], batch_first=True)
    steps = states.shape[1]
    mask = torch.arange(steps - 1)[None, :] < (lengths - 1)[:, None]  # a state with a word after it
    return lm.loss(states[:, :-1][mask], ids[:, 1:steps][mask], out, vectors)


def _padded(sentences: list[np.ndarray], reverse: bool) -> tuple[Tensor, Tensor]:
    lengths = torch.tensor([len(s) for s in sentences])
    ids = torch.zeros(len(sentences), int(lengths.max()), dtype=torch.long)
    for row, s in enumerate(sentences):
        ids[row, : len(s)] = torch.from_numpy((s[::-1] if reverse else s).copy())
    return ids, lengths


def cache_key(data: Any, epochs: int, net: HAN) -> str:
    payload = [VERSION, epochs, sorted(data.cache_keys.items()), len(data.vocab), net.config.embed_dim,
               net.config.word_hidden, data.hparams.seed, float(net.embedding.weight.detach().sum())]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]


def pretrain_word_encoder(net: HAN, data: Any, epochs: int, cache_dir: Path, deadline: float | None = None,
                          lr: float = 3e-3) -> None:
    """``epochs`` passes of the word BiGRU as two language models over the text (or what the time
    until ``deadline``, a ``time.monotonic()`` reading, allows); the weights go into ``net.word_rnn``."""
    path = Path(cache_dir) / f"word-encoder-{cache_key(data, epochs, net)}.safetensors"
    if path.is_file():
        net.word_rnn.load_state_dict(load_file(str(path)))
        rank_zero_info(f"pre-trained word encoder: reusing {path}")
        return
    sentences = _sentences(data)
    words = sum(len(s) for s in sentences)
    counts = np.bincount(np.concatenate(sentences), minlength=net.config.vocab_size).astype(np.float64)
    noise = torch.from_numpy(counts**0.75 / (counts**0.75).sum()).float()
    lm = _LanguageModels(net, noise)
    vectors = net.embedding.weight.detach()
    rnn = net.word_rnn
    optimizer = torch.optim.Adam([*rnn.parameters(), *lm.parameters()], lr=lr)
    rng = np.random.default_rng(data.hparams.seed)
    batches = [batch for _ in range(epochs) for batch in _batches(sentences, rng)]  # every pass, in order
    total = len(batches)
    warm = max(1, total // 10)  # a tenth of the steps warming up, then down linearly
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warm) * max(0.05, 1 - s / total))
    rank_zero_info(f"pre-training the word encoder: {epochs} passes over {len(sentences):,} sentences "
                   f"({words:,} words) of the training and unlabelled text")
    losses: list[float] = []
    with Step("pre-training the word encoder", total, unit="batches") as step:
        for batch in batches:
            chosen = [sentences[i] for i in batch]
            loss = 0.0
            for direction, out, reverse in ((rnn.forward_rnn, lm.forward_out, False),
                                            (rnn.backward_rnn, lm.backward_out, True)):
                ids, lengths = _padded(chosen, reverse)
                loss = loss + _direction_loss(direction, out, lm, vectors, ids, lengths)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_([*rnn.parameters(), *lm.parameters()], 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item() / 2)
            step.update(1)
            if deadline is not None and time.monotonic() > deadline:
                break
    stopped = len(losses) < total
    first, last = np.mean(losses[: max(1, len(losses) // 20)]), np.mean(losses[-max(1, len(losses) // 20):])
    rank_zero_info(f"pre-trained word encoder: sampled-softmax loss {first:.2f} -> {last:.2f} over {len(losses)} "
                   f"batches" + (" (stopped by the time budget)" if stopped else ""))
    if not stopped:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in rnn.state_dict().items()}, str(path))


PRETRAIN_BUDGET = 0.25  # of trainer.max_time, at most, for pre-training the word encoder


def pretrain_in_budget(net: Any, data: Any, epochs: int, trainer: Any) -> None:
    """The word encoder pre-trained within the fit's time budget: a quarter of ``trainer.max_time`` at
    most, and the time it takes is the fit's (Lightning's Timer starts later, at the first epoch)."""
    from pytorch_lightning.callbacks import Timer

    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    budget = timer.time_remaining() if timer is not None else None
    started = time.monotonic()
    deadline = started + PRETRAIN_BUDGET * budget if budget is not None else None
    pretrain_word_encoder(net, data, epochs, Path(data.hparams.cache_dir), deadline)
    if timer is not None:
        timer._offset += time.monotonic() - started  # Lightning's elapsed time (a resumed fit restores it)
