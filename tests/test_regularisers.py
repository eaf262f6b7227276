"""The training-only regularisers: adversarial word vectors (training.adversarial) and the sentence
attention's losses (training.attention_losses), on a real (tiny) HAN."""

from __future__ import annotations

import math

import pytest
import torch

from han.batch import collate
from han.model import HAN, HANConfig
from training import adversarial
from training.attention_losses import sentence_entropy, sentence_evidence
from training.module import HANModule


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


def test_sentence_evidence_is_the_attention_on_the_sentence_that_says_the_label_alone() -> None:
    weights = torch.tensor([[0.2, 0.8, 0.0], [0.25, 0.5, 0.25], [1.0, 0.0, 0.0]])
    lengths = torch.tensor([2, 3, 1])
    sentence_logits = torch.tensor([[[2.0, -2.0], [-2.0, 2.0], [9.0, -9.0]],  # label 0's sentence first; padding
                                    # that would fit label 0 best, never chosen
                                    [[0.0, 0.0], [0.0, 0.0], [3.0, -3.0]],  # the last says label 0
                                    [[-5.0, 5.0], [9.0, 9.0], [9.0, 9.0]]], requires_grad=True)  # one sentence: out
    attention = weights.clone().requires_grad_(True)
    loss = sentence_evidence(attention, sentence_logits, lengths, torch.tensor([0, 0, 1]), multi_label=False)
    expected = (-math.log(0.2) / math.log(2) - math.log(0.25) / math.log(3)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    assert sentence_logits.grad is None and attention.grad[0, 0] < 0  # the choice gets no gradient; more on sentence 0
    # the other label, as soft rows (self-training): doc 0's telling sentence is now its second
    soft = torch.tensor([[0.1, 0.9], [0.9, 0.1], [0.0, 1.0]])
    expected = (-math.log(0.8) / math.log(2) - math.log(0.25) / math.log(3)) / 2
    assert sentence_evidence(weights, sentence_logits, lengths, soft, False).item() == pytest.approx(expected, rel=1e-5)
    # multi-label 0/1 rows: the sentence whose logits fit all of the document's labels
    rows = torch.tensor([[0, 1], [1, 0], [1, 1]])
    assert sentence_evidence(weights, sentence_logits, lengths, rows, True).item() == pytest.approx(expected, rel=1e-5)
    assert sentence_evidence(weights[2:], sentence_logits[2:], lengths[2:], rows[2:], True).item() == 0.0


def test_with_own_values_the_logits_are_the_attention_weighted_sentence_logits() -> None:
    torch.manual_seed(0)
    net = HAN(HANConfig(vocab_size=30, num_labels=3, embed_dim=8, word_hidden=6, sentence_hidden=6,
                        attention_dim=8, dropout=0.0, word_dropout=0.0, sentence_values="own"))
    batch = collate([[[2, 3, 4], [5, 6, 7], [8]], [[9, 10]]])
    output = net.train()(*batch)
    weighted = (output.sentence_weights.unsqueeze(-1) * output.sentence_logits).sum(1)
    assert torch.allclose(output.logits, weighted, atol=1e-5)  # the weights sum to 1: the bias is in each
    assert net.eval()(*batch).sentence_logits is None  # inference does not compute them
    output = net.train()(*batch)
    sentence_evidence(output.sentence_weights, output.sentence_logits, batch[2], torch.tensor([0, 2]), False).backward()
    assert net.head.weight.grad is None  # the head does not learn from the loss; what scores sentences does
    assert net.sentence_attention.context.grad.abs().sum() > 0
    assert net.word_rnn.forward_rnn.weight_ih_l0.grad.abs().sum() > 0


def test_the_regularisers_refuse_negative_settings() -> None:
    for name in ("adversarial", "sentence_focus", "sentence_evidence"):
        with pytest.raises(ValueError, match=f"model.{name} must be at least 0"):
            HANModule(vocab_size=10, num_labels=2, **{name: -0.1})
