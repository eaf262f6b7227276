"""The network: attention weights are proper distributions, padding changes nothing, it can learn."""

from __future__ import annotations

import pytest
import torch

from benchmarks.train_speed import nn_gru_both_ways  # nn.GRU itself, the reference
from han import HAN, HANConfig, collate
from han.cpu_kernels import Recurrence
from han.model import BiGRU
from tests.tiny_model import train_tiny_model


def make_model(seed: int = 0, multi_label: bool = False, sentence_values: str = "contextual") -> HAN:
    torch.manual_seed(seed)
    config = HANConfig(vocab_size=50, num_labels=3, multi_label=multi_label, embed_dim=8,
                       word_hidden=6, sentence_hidden=5, attention_dim=7, sentence_values=sentence_values)
    return HAN(config).eval()


def random_document(generator: torch.Generator, sentences: int, max_words: int) -> list[list[int]]:
    lengths = torch.randint(1, max_words + 1, (sentences,), generator=generator).tolist()
    return [torch.randint(2, 50, (n,), generator=generator).tolist() for n in lengths]


def test_weights_sum_to_one_over_real_tokens_and_are_zero_on_padding() -> None:
    g = torch.Generator().manual_seed(1)
    docs = [random_document(g, s, 9) for s in (1, 4, 7)]
    out = make_model()(*collate(docs))
    assert out.logits.shape == (3, 3)
    assert out.sentence_weights.shape == (3, 7) and out.word_weights.shape[:2] == (3, 7)
    for d, doc in enumerate(docs):
        assert torch.allclose(out.sentence_weights[d, : len(doc)].sum(), torch.tensor(1.0), atol=1e-6)
        assert torch.all(out.sentence_weights[d, len(doc):] == 0)
        for s, sentence in enumerate(doc):
            assert torch.allclose(out.word_weights[d, s, : len(sentence)].sum(), torch.tensor(1.0), atol=1e-6)
            assert torch.all(out.word_weights[d, s, len(sentence):] == 0)
        assert torch.all(out.word_weights[d, len(doc):] == 0)


@pytest.mark.parametrize("sentence_values", ["contextual", "own"])
def test_a_document_scores_the_same_alone_and_in_a_batch_of_longer_documents(sentence_values: str) -> None:
    g = torch.Generator().manual_seed(2)
    model = make_model(sentence_values=sentence_values)
    short = random_document(g, 2, 3)
    long_docs = [random_document(g, 30, 40) for _ in range(5)]
    alone = model(*collate([short]))
    batched = model(*collate([long_docs[0], short, *long_docs[1:]]))
    torch.testing.assert_close(batched.logits[1], alone.logits[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(batched.sentence_weights[1, :2], alone.sentence_weights[0], atol=1e-5, rtol=0)
    width = alone.word_weights.shape[2]
    torch.testing.assert_close(batched.word_weights[1, :2, :width], alone.word_weights[0], atol=1e-5, rtol=0)
    assert torch.all(batched.word_weights[1, :, width:] == 0)


def test_own_sentence_values_make_the_document_vector_the_weighted_mean_of_the_sentence_vectors() -> None:
    """With sentence_values="own" the head reads sum_i w_i v_i, v_i a sentence's vector from its words
    alone: a sentence's weight is exactly its share, and removing it changes no other v_i."""
    g = torch.Generator().manual_seed(4)
    docs = [random_document(g, n, 9) for n in (1, 4, 7)]
    batch = collate(docs)
    read: list[torch.Tensor] = []
    for values in ("contextual", "own"):
        model = make_model(sentence_values=values)
        handle = model.head.register_forward_hook(lambda _m, inputs, _o: read.append(inputs[0]))
        with torch.no_grad():
            out = model(*batch)
            vectors, _ = model.sentence_vectors(batch.words, batch.sentence_lengths)
        handle.remove()
    per_document = vectors.split([len(doc) for doc in docs])
    own = torch.stack([(out.sentence_weights[d, : len(v), None] * v).sum(0) for d, v in enumerate(per_document)])
    torch.testing.assert_close(read[1], own, atol=1e-6, rtol=0)
    assert read[0].shape[1] == 10 and read[1].shape[1] == 12  # 2 x sentence_hidden, 2 x word_hidden
    with pytest.raises(ValueError, match="sentence_values must be one of contextual, own"):
        HANConfig(vocab_size=5, num_labels=2, sentence_values="states")


def test_probabilities_are_softmax_or_sigmoid_by_task() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    single = make_model().probabilities(logits)
    assert torch.allclose(single.sum(), torch.tensor(1.0))
    assert torch.allclose(single, torch.exp(logits) / torch.exp(logits).sum())  # softmax: e^x over its sum
    multi = make_model(multi_label=True).probabilities(logits)
    assert torch.allclose(multi, torch.sigmoid(logits))


def test_the_model_learns_the_fixture_to_near_zero_loss() -> None:
    _, losses = train_tiny_model(steps=60)
    assert losses[0] > 0.5
    assert losses[-1] < 0.01
    _, losses = train_tiny_model(steps=80, multi_label=True)
    assert losses[-1] < 0.02


@pytest.mark.parametrize("sentence_values", ["contextual", "own"])
def test_training_inference_and_attribution_paths_agree(sentence_values: str) -> None:
    """The three ways through the network compute the same thing: training (the recurrence with its
    backward written out, tanh attention), inference (no gradients: each distinct word projected once,
    tanh as a sigmoid) and attributions (eval mode with gradients)."""
    g = torch.Generator().manual_seed(3)
    model = make_model(sentence_values=sentence_values)
    model.config.word_dropout = 0.0
    model.dropout.p = 0.0  # so that training mode computes what eval mode does
    docs = [random_document(g, n, 25) for n in (1, 3, 9, 20, 2, 14)] * 30  # the running sequences shrink at many steps
    batch = collate(docs)
    with torch.no_grad():
        inference = model.eval()(*batch)
    attribution = model(*batch)  # eval mode with gradients
    training = model.train()(*batch)
    assert attribution.logits.requires_grad and training.logits.requires_grad
    for other in (attribution, training):
        torch.testing.assert_close(other.logits, inference.logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(other.word_weights, inference.word_weights, atol=1e-5, rtol=0)
        torch.testing.assert_close(other.sentence_weights, inference.sentence_weights, atol=1e-5, rtol=0)


def test_bigru_with_gradients_matches_nn_gru_values_and_every_gradient() -> None:
    """Training's recurrence (its backward through time written out in han.cpu_kernels) gives nn.GRU's
    states, and the same gradients for the inputs and every weight; padding stays zero."""
    torch.manual_seed(4)
    rnn = BiGRU(6, 5).train()
    lengths = torch.randint(1, 30, (300,))
    x = torch.randn(300, 30, 6, requires_grad=True)
    weights = torch.randn(300, 30, 10)
    ours = rnn(x, lengths)
    reference = nn_gru_both_ways(rnn, x, lengths)
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=0)
    padding = torch.arange(30) >= lengths.unsqueeze(1)
    assert ours[padding].abs().max() == 0
    parameters = [x, *rnn.parameters()]
    expected = torch.autograd.grad((reference * weights).sum(), parameters)
    got = torch.autograd.grad((ours * weights).sum(), parameters)
    for name, a, b in zip(["input"] + [n for n, _ in rnn.named_parameters()], got, expected, strict=True):
        assert b.abs().sum() > 0
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=name)


def test_the_recurrences_written_backward_passes_gradcheck() -> None:
    """Recurrence's backward through time against finite differences (float64), with sequences ending at
    different steps (the running rows shrink), and a retained graph backpropagated twice."""
    torch.manual_seed(6)
    sizes = [4, 4, 3, 1, 1]  # 4 sequences of lengths 5, 3, 3, 2: the running ones at each step
    gi = torch.randn(2, sum(sizes), 9, dtype=torch.float64, requires_grad=True)
    w_hh = torch.randn(2, 3, 9, dtype=torch.float64, requires_grad=True)
    b_hh = torch.randn(2, 1, 9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda g, w, b: Recurrence.apply(g, w, b, sizes), (gi, w_hh, b_hh))
    loss = Recurrence.apply(gi, w_hh, b_hh, sizes).square().sum()
    first = torch.autograd.grad(loss, (gi, w_hh), retain_graph=True)
    second = torch.autograd.grad(loss, (gi, w_hh))
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_bigru_read_by_distinct_input_matches_nn_gru_values_and_gradients() -> None:
    """The inference recurrence (inputs given once per distinct word, read through an index) gives
    nn.GRU's states, and the same input gradients (what attributions differentiate)."""
    torch.manual_seed(5)
    rnn = BiGRU(6, 5)
    lengths = torch.tensor([3, 1, 7, 2, 7])
    distinct = torch.randn(4, 6)
    index = torch.randint(0, 4, (int(lengths.sum()),))
    mask = torch.arange(7) < lengths.unsqueeze(1)
    with torch.no_grad():
        by_index = rnn.eval().read(distinct, lengths, index)
    flat = distinct[index].clone().requires_grad_()
    read = rnn.read(flat, lengths)
    padded = torch.zeros(5, 7, 6)
    padded[mask] = distinct[index]
    padded.requires_grad_()
    dense = nn_gru_both_ways(rnn, padded, lengths)[mask]  # nn.GRU itself
    torch.testing.assert_close(by_index, dense.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(read.detach(), dense.detach(), atol=1e-6, rtol=0)
    weights = torch.randn(read.shape)
    (read * weights).sum().backward()
    (dense * weights).sum().backward()
    assert flat.grad is not None and padded.grad is not None
    torch.testing.assert_close(flat.grad, padded.grad[mask], atol=1e-5, rtol=0)
    # Training reads each distinct word's input once too, with gradients: each distinct input gets the
    # sum of its positions' gradients.
    distinct.requires_grad_()
    trained = rnn.train().read(distinct, lengths, index)
    torch.testing.assert_close(trained.detach(), dense.detach(), atol=1e-6, rtol=0)
    (trained * weights).sum().backward()
    summed = torch.zeros(4, 6).index_add(0, index, padded.grad[mask])
    assert distinct.grad is not None
    torch.testing.assert_close(distinct.grad, summed, atol=1e-5, rtol=0)


@pytest.mark.parametrize("gather_bytes", [1, 700, 8 << 20])
def test_the_inference_recurrence_reads_its_inputs_in_runs_of_steps_to_the_same_states(
    monkeypatch: pytest.MonkeyPatch, gather_bytes: int
) -> None:
    """Without gradients the recurrence gathers its input terms a run of steps at a time, as many as
    GATHER_BYTES holds (at least one step): one step a read, a few steps, or all at once give nn.GRU's states."""
    monkeypatch.setattr("han.cpu_kernels.GATHER_BYTES", gather_bytes)
    torch.manual_seed(7)
    rnn = BiGRU(6, 5).eval()
    lengths = torch.tensor([3, 1, 7, 2, 7, 5])
    mask = torch.arange(7) < lengths.unsqueeze(1)
    padded = torch.zeros(6, 7, 6)
    padded[mask] = torch.randn(int(lengths.sum()), 6)
    with torch.no_grad():
        ours = rnn.read(padded[mask], lengths)
        reference = nn_gru_both_ways(rnn, padded, lengths)[mask]
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=0)
