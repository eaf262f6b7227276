"""Self-training leaves the labelled documents out of the pseudo-labelled set; a warm start keeps the
stored model's language."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from han import Pipeline, SavedModel, SegmenterConfig
from tests.test_training import REPO, REVIEWS, SMOKE, fit, rows
from tests.tiny_model import train_tiny_model
from training.cli import main
from training.self_training import SelfTraining, pseudo_label

ZH_NEWS = REPO / "data" / "fixtures" / "zh_news.jsonl"
NEW = ["A superb film, I loved every minute of it.", "Dreadful and dull. I walked out.",
       "Wonderful acting, a great story.", "Boring, the worst film this year."]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.parametrize("validation_file", [True, False])
def test_pseudo_labelling_leaves_out_the_training_validation_and_test_documents(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], validation_file: bool) -> None:
    """A file of all the user's text (the common case) holds the labelled documents: none of the training,
    validation (a file, or carved from the training file) or test documents may come back pseudo-labelled."""
    reviews = rows(REVIEWS)
    model = train_tiny_model(steps=30)[0].save(tmp_path / "teacher")
    train = write_jsonl(tmp_path / "train.jsonl", reviews[:20] if validation_file else reviews[:26])
    validation = write_jsonl(tmp_path / "validation.jsonl", reviews[20:26]) if validation_file else None
    test = write_jsonl(tmp_path / "test.jsonl", reviews[26:])
    unlabeled = write_jsonl(tmp_path / "all.jsonl", [{"text": t} for t in [r["text"] for r in reviews] + NEW])
    config = SimpleNamespace(
        data=SimpleNamespace(train=str(train), validation=validation and str(validation), test=str(test),
                             unlabeled=str(unlabeled), text_column="text", label_column="label",
                             max_train_docs=None, max_eval_docs=None),
        self_training=SelfTraining(fraction=1.0))
    counts = pseudo_label(model, config, tmp_path / "pseudo.parquet")
    chosen = pq.read_table(tmp_path / "pseudo.parquet").column("text").to_pylist()
    assert chosen and set(chosen) <= set(NEW), "only text no split holds is pseudo-labelled"
    assert counts["unlabeled"] == 36 and counts["left_out"] == 32 and counts["chosen"] == len(chosen) == 4
    err = capsys.readouterr().err
    assert "self-training: left out 32 of the 36 unlabelled documents: the same text as a document of the " \
           "training, validation or test split" in err


def zh_model(tmp_path: Path) -> Path:
    """A stored model that segments Chinese (the tiny model's sizes, as smoke.yaml's)."""
    saved = train_tiny_model(steps=1)[0]
    saved.segmenter = SegmenterConfig(max_sentences=8, max_words=20, language="zh")
    return saved.save(tmp_path / "han-zh")


def test_a_warm_start_takes_the_stored_models_language_unless_one_is_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    stored = zh_model(tmp_path)

    def language(*overrides: str) -> str:
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            main(["fit", "--config", SMOKE, "--trainer.default_root_dir", str(tmp_path / "run"), "--data.cache_dir",
                  str(tmp_path / "cache"), f"--data.train={ZH_NEWS}", "--data.validation=null", "--data.test=null",
                  *overrides, "--print_config"])
        assert stop.value.code == 0
        return yaml.safe_load(capsys.readouterr().out)["data"]["language"]

    # as docs/labeling.md's round command reads: no --data.language
    assert language("--model.init_from", str(stored)) == "zh"
    assert language("--model.init_from", str(stored), "--data.language", "zh") == "zh"
    assert language() == "en"  # no warm start: English, as before
    assert language("--data.language", "de") == "de"
    # a language given that is not the stored model's stops, in one line naming both
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--model.init_from", str(stored), "--data.language", "en", data=ZH_NEWS)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "is in language 'zh', this run's data.language is 'en'" in err
    # a fit: the data segmented, and the new model saved, as Chinese
    root = fit(tmp_path / "warm", "--model.init_from", str(stored), "--trainer.max_epochs", "0",
               "--export.faithfulness", "0", data=ZH_NEWS)
    assert SavedModel.load(root / "model").segmenter.language == "zh"
    err = capsys.readouterr().err
    assert f"data.language=zh: the language of the stored model (model.init_from {stored})" in err


def test_a_warm_started_checkpoint_is_tested_and_predicted_without_the_model_it_started_from(tmp_path: Path) -> None:
    import shutil

    # Sizes unlike the config's, so that the checkpoint must say them: the run's settings would build another net.
    stored = fit(tmp_path / "stored", "--model.embed_dim", "20", "--model.sentence_values", "own",
                 "--trainer.max_epochs", "2", "--export.faithfulness", "0")
    warm = fit(tmp_path / "warm", "--model.init_from", str(stored / "model"), "--trainer.max_epochs", "1",
               "--export.faithfulness", "0")
    saved = SavedModel.load(warm / "model")
    assert (saved.model.config.embed_dim, saved.model.config.sentence_values) == (20, "own")
    shutil.rmtree(stored)  # deleted, as a store's old versions are; or NAME:production now names this one
    metrics = json.loads((warm / "report" / "test" / "metrics.json").read_text())
    (warm / "report" / "test" / "metrics.json").unlink()
    common = ["--config", SMOKE, "--trainer.default_root_dir", str(warm), "--data.cache_dir",
              str(tmp_path / "warm" / "cache"), "--ckpt_path", saved.metadata["checkpoint"],
              "--export.faithfulness", "0"]
    main(["test", *common])
    assert json.loads((warm / "report" / "test" / "metrics.json").read_text())["han_alone"] == metrics["han_alone"]
    main(["predict", *common])
    predicted = [line["scores"] for line in rows(warm / "predictions" / "test.jsonl")]
    expected = [r.scores for r in Pipeline(saved)([r["text"] for r in rows(REVIEWS)])]
    assert [p["pos"] for p in predicted] == pytest.approx([e["pos"] for e in expected], abs=1e-5)
