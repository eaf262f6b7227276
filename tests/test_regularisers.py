"""The training-only regularisers: adversarial word vectors (training.adversarial) and the sentence-focus
penalty (training.module.sentence_entropy), on a real (tiny) HAN."""

from __future__ import annotations

import pytest
import torch

from han.batch import collate
from han.model import HAN, HANConfig
from training import adversarial
from training.module import HANModule, sentence_entropy


def _net_and_batch() -> tuple[HAN, tuple, torch.Tensor]:
    torch.manual_seed(0)
    net = HAN(HANConfig(vocab_size=30, num_labels=2, embed_dim=8, word_hidden=6, sentence_hidden=6,
                        attention_dim=8, dropout=0.0, word_dropout=0.0))
    docs = [[[2, 3, 4], [5, 6, 7]], [[8, 9, 10, 11]], [[3, 12], [13, 14, 15]]]  # sentences of word ids
    return net, collate(docs), torch.tensor([0, 1, 0])


def test_the_adversarial_move_raises_the_loss_and_leaves_other_words_alone() -> None:
    net, batch, target = _net_and_batch()
    loss_fn = torch.nn.CrossEntropyLoss()
    with adversarial.watched(net.embedding) as seen:
        loss = loss_fn(net(*batch).logits, target)
    ids, moves = adversarial.direction(loss, seen, 0.05)
    assert moves.shape == (len(ids), 8)
    rms = seen.vectors[0].detach().pow(2).mean().sqrt()
    assert moves.pow(2).mean().sqrt().item() == pytest.approx(0.05 * rms.item(), rel=1e-4)
    with adversarial.moved(net.embedding, ids, moves):
        moved = loss_fn(net(*batch).logits, target)
        unseen = net.embedding(torch.tensor([20, 21]))
    assert moved > loss + 1e-4  # uphill: the direction of the loss's gradient
    with adversarial.moved(net.embedding, ids, -moves):
        assert loss_fn(net(*batch).logits, target) < loss  # and downhill the other way
    assert torch.equal(unseen, net.embedding(torch.tensor([20, 21])))  # words the batch did not look up
    assert not net.embedding._forward_hooks  # the hooks go when the blocks end


def test_fixed_vectors_get_a_direction_too_and_a_word_looked_up_twice_one_move() -> None:
    net, batch, target = _net_and_batch()
    net.embedding.weight.requires_grad_(False)  # the first epochs' fixed vectors
    with adversarial.watched(net.embedding) as seen:
        loss = torch.nn.functional.cross_entropy(net(*batch).logits, target)
        loss = loss + 1e-3 * net.embedding(torch.tensor([3, 4])).pow(2).sum()  # a second lookup of two of its words
    ids, moves = adversarial.direction(loss, seen, 0.02)
    assert moves.abs().sum() > 0 and torch.equal(ids, torch.unique(ids)) and len(ids) == 14


def test_sentence_entropy_is_a_share_of_its_largest() -> None:
    weights = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    lengths = torch.tensor([2, 2, 1, 3])
    # flat over two, all on one of two, a one-sentence document (left out), flat over three
    assert sentence_entropy(weights, lengths).item() == pytest.approx((1.0 + 0.0 + 1.0) / 3)
    assert sentence_entropy(weights[2:3], lengths[2:3]).item() == 0.0


def test_the_regularisers_refuse_negative_settings() -> None:
    for name in ("adversarial", "sentence_focus"):
        with pytest.raises(ValueError, match=f"model.{name} must be at least 0"):
            HANModule(vocab_size=10, num_labels=2, **{name: -0.1})
