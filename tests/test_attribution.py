"""Explanation methods: shapes, sign conventions, and what each one claims to measure."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from han import Pipeline, SavedModel
from han.attribution import attribute, integrated_gradients
from han.batch import collate_flat
from han.methods import METHODS, SIGNED
from han.model import to_documents
from han.vocab import Vocabulary
from tests.tiny_model import train_tiny_model

TEXTS = ["A wonderful film. The cast is superb! I loved it.", "Awful. Boring plot.", "Superb."]


@pytest.fixture(scope="module", params=["contextual", "own"])
def pipeline(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Pipeline:
    """The tests' tiny model, and one whose sentence attention averages the sentences' own vectors."""
    if request.param == "contextual":
        return Pipeline(SavedModel.load(tiny_model_dir))
    saved, _ = train_tiny_model(sentence_values="own")
    assert saved.model.config.sentence_values == "own"
    return Pipeline(saved)


def batch_of(pipeline: Pipeline, texts: list[str]):
    return collate_flat([pipeline.encode(s) for s in pipeline.segment(texts)])


@pytest.mark.parametrize("method", METHODS)
def test_each_method_weighs_every_real_sentence_and_word_and_nothing_else(pipeline: Pipeline, method: str) -> None:
    batch = batch_of(pipeline, TEXTS)
    logits, sentences, words = attribute(pipeline.model, batch, method)
    docs, max_sentences, max_words = len(TEXTS), int(batch.document_lengths.max()), batch.words.shape[1]
    assert logits.shape == (docs, 2)
    assert sentences.shape == (docs, max_sentences) and words.shape == (docs, max_sentences, max_words)
    real = torch.arange(max_sentences) < batch.document_lengths[:, None]
    assert torch.all(sentences[~real] == 0) and torch.all(words[~real] == 0)
    if method not in SIGNED:  # the signed ones' meaning is tested below (drops, and completeness)
        assert torch.all(sentences >= 0) and torch.all(words >= 0)
        assert torch.allclose(sentences.sum(1), torch.ones(docs), atol=1e-5)
    # the logits are the model's, whatever the method
    with torch.inference_mode():
        torch.testing.assert_close(logits, pipeline.model(*batch).logits, atol=1e-5, rtol=1e-4)


def test_a_sentences_occlusion_weight_is_the_measured_drop_when_it_is_removed(pipeline: Pipeline) -> None:
    text = TEXTS[0]
    _, sentences, _ = attribute(pipeline.model, batch_of(pipeline, [text]), "occlusion")
    (full,) = pipeline([text], explain=True)
    label = full.label
    for s, sentence in enumerate(full.sentences):
        without = text[: sentence.start] + text[sentence.end :]
        (result,) = pipeline([without])
        assert sentences[0, s].item() == pytest.approx(full.scores[label] - result.scores[label], abs=1e-5)


def test_occlusion_in_a_batch_is_each_variant_run_through_the_whole_network(pipeline: Pipeline) -> None:
    # Occlusion reruns only what a change touches; here every variant runs whole, one at a time.
    model, batch = pipeline.model, batch_of(pipeline, TEXTS)
    _, sentences, words = attribute(model, batch, "occlusion")
    encoded = [pipeline.encode(s) for s in pipeline.segment(TEXTS)]

    def p(ids: torch.Tensor, lengths: torch.Tensor, label: int) -> float:
        with torch.inference_mode():
            return model.probabilities(model(*collate_flat([(ids.numpy(), lengths.numpy())])).logits)[0, label].item()

    for d, (ids, lengths) in enumerate(encoded):
        ids, lengths = torch.as_tensor(ids), torch.as_tensor(lengths)
        label = int(attribute(model, batch, "attention")[0][d].argmax())
        full, starts = p(ids, lengths, label), torch.cumsum(lengths, 0) - lengths
        for s in range(len(lengths)):
            keep = torch.arange(len(lengths)) != s
            if keep.any():
                kept_ids = torch.cat([ids[starts[j] : starts[j] + lengths[j]] for j in range(len(lengths)) if j != s])
                without = p(kept_ids, lengths[keep], label)
            else:  # its only sentence taken out: one unknown word
                without = p(torch.tensor([Vocabulary.unk_id]), torch.tensor([1]), label)
            assert sentences[d, s].item() == pytest.approx(full - without, abs=1e-5)
            for w in range(int(lengths[s])):
                changed = ids.clone()
                changed[starts[s] + w] = Vocabulary.unk_id
                assert words[d, s, w].item() == pytest.approx(full - p(changed, lengths, label), abs=1e-5)


def test_integrated_gradients_add_up_to_the_change_from_an_empty_input(pipeline: Pipeline) -> None:
    """Completeness, with enough steps for the tiny models' sharp paths (32, the default, leaves up to
    0.6 of the change unaccounted for on the "own" one: a coarse integral, not a wrong gradient)."""
    batch = batch_of(pipeline, TEXTS)
    logits, sentences, words = integrated_gradients(pipeline.model, batch, None, steps=256)
    target = logits.argmax(-1)
    handle = pipeline.model.embedding.register_forward_hook(lambda _m, _i, output: output * 0)
    try:
        with torch.inference_mode():
            empty = pipeline.model.probabilities(pipeline.model(*batch).logits)
    finally:
        handle.remove()
    probs = pipeline.model.probabilities(logits)
    change = probs.gather(1, target[:, None]) - empty.gather(1, target[:, None])
    torch.testing.assert_close(words.sum((1, 2)), change.squeeze(1), atol=2e-3, rtol=0)
    torch.testing.assert_close(sentences, words.sum(-1))


@pytest.mark.parametrize("method", METHODS)
def test_each_method_works_while_the_embedding_table_is_frozen(tiny_model_dir: Path, method: str) -> None:
    # a fit freezes the vectors for its first epochs and measures faithfulness on that network at export
    pipeline = Pipeline(SavedModel.load(tiny_model_dir))
    pipeline.model.embedding.weight.requires_grad_(False)
    batch = batch_of(pipeline, TEXTS)
    reference = attribute(Pipeline(SavedModel.load(tiny_model_dir)).model, batch, method)
    for got, expected in zip(attribute(pipeline.model, batch, method), reference, strict=True):
        torch.testing.assert_close(got, expected)


def test_the_pipeline_names_the_method_and_refuses_an_unknown_one(pipeline: Pipeline) -> None:
    (result,) = pipeline([TEXTS[0]], explain="attention_gradient")
    assert result.method == "attention_gradient"
    (plain,) = pipeline([TEXTS[0]])
    assert plain.method is None and plain.scores == result.scores
    with pytest.raises(ValueError, match="unknown explanation method 'shap'; choose one of attention, "):
        pipeline([TEXTS[0]], explain="shap")


def test_attention_gradient_is_each_attention_weight_times_the_labels_sensitivity_to_it(pipeline: Pipeline) -> None:
    """A weight's score is a * d p(label) / d a (Serrano & Smith), measured here without autograd: scaling
    one attention weight by (1 + t) moves the vector it pools by t * a * value, and the central difference
    (p(+t) - p(-t)) / 2t of the label's probability is a * d p / d a. The tiny models are sure of these
    texts (p within 1e-6 of 1: every sensitivity near 0), so the head is scaled down to bring p to the
    middle, where the sensitivities are large enough to tell a right score from a zero one; in double
    precision, for differences far below the scores."""
    model, batch = copy.deepcopy(pipeline.model).double(), batch_of(pipeline, TEXTS)
    with torch.no_grad():
        model.head.weight.mul_(0.05)
        model.head.bias.mul_(0.05)
    logits, sentences, words = attribute(model, batch, "attention_gradient")
    target = logits.argmax(-1)
    seen: dict[str, tuple] = {}

    def keeping(name: str):
        def hook(_module: torch.nn.Module, inputs: tuple, output: tuple) -> None:
            seen[name] = (inputs, output)

        return hook

    hooks = [
        model.word_attention.register_forward_hook(keeping("word")),
        model.sentence_attention.register_forward_hook(keeping("sentence")),
    ]
    try:
        with torch.inference_mode():
            model(*batch)
    finally:
        for hook in hooks:
            hook.remove()
    (word_values, _), (vectors, word_weights) = seen["word"]  # values: the real words, flat, sentence by sentence
    (_, _, sentence_values), (pooled, sentence_weights) = seen["sentence"]  # values: the sentences, flat
    t = 1e-4
    owners = torch.repeat_interleave(torch.arange(len(TEXTS)), batch.document_lengths)
    sentence_starts = torch.cumsum(batch.document_lengths, 0) - batch.document_lengths
    word_starts = torch.cumsum(batch.sentence_lengths, 0) - batch.sentence_lengths

    def p_pooled(d: int, moved: torch.Tensor) -> float:
        with torch.inference_mode():
            return model.probabilities(model.head(moved))[target[d]].item()

    def p_vectors(d: int, moved: torch.Tensor) -> float:
        with torch.inference_mode():
            document_logits, _ = model.classify(to_documents(moved, batch.document_lengths), batch.document_lengths)
            return model.probabilities(document_logits)[d, target[d]].item()

    checked = 0
    for row, d in enumerate(owners.tolist()):
        s = row - int(sentence_starts[d])
        step = t * sentence_weights[d, s] * sentence_values[row]
        expected = (p_pooled(d, pooled[d] + step) - p_pooled(d, pooled[d] - step)) / (2 * t)
        assert sentences[d, s].item() == pytest.approx(expected, abs=1e-8, rel=1e-4)
        for w in range(int(batch.sentence_lengths[row])):
            moved = vectors.clone()
            step = t * word_weights[row, w] * word_values[int(word_starts[row]) + w]
            moved[row] += step
            up = p_vectors(d, moved)
            moved[row] -= 2 * step
            expected = (up - p_vectors(d, moved)) / (2 * t)
            assert words[d, s, w].item() == pytest.approx(expected, abs=1e-8, rel=1e-4)
            checked += abs(expected) > 1e-6
    assert checked > int(batch.sentence_lengths.sum()) // 2  # most words move the label: the check has teeth
    assert sentences[sentences != 0].numel() == int(batch.document_lengths.sum())  # every real sentence scored
