"""How ``han-train fit`` reads data it was not written against: empty labels, rare classes, ``.TXT`` files,
documents without a word, pandas' CSVs, Unicode digit labels and lists in a CSV's label cells."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from training import tokenise
from training.data import HANDataModule
from training.ngram_teacher import mixed_targets
from training.recipe import profile
from training.sources import DataError, load_source
from training.splits import stable_holdout

GOOD = ["a good film, really good", "a bad film with bad acting", "a good plot", "a bad and slow plot"]


def _jsonl(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def _tokenised(tmp_path: Path, source: str, **options) -> datasets.Dataset:
    module = HANDataModule(train=source, cache_dir=str(tmp_path / "cache"), min_freq=1, **options)
    return module._tokenised("train", source, None)


def test_an_empty_label_is_refused_by_its_row_in_every_format(tmp_path: Path) -> None:
    labels = ["pos", "neg", "pos", "", "neg"]
    records = [{"text": t, "label": label} for t, label in zip([*GOOD, "fine"], labels, strict=True)]
    jsonl = _jsonl(tmp_path / "empty.jsonl", records)
    with pytest.raises(DataError, match=r"^train \(.*empty\.jsonl\) row 3: the label is empty"):
        _tokenised(tmp_path, jsonl)
    parquet = tmp_path / "blank.parquet"
    pq.write_table(pa.table({"text": [*GOOD, "fine"], "label": ["pos", "neg", "  \t", "pos", "neg"]}), parquet)
    with pytest.raises(DataError, match=r"^train \(.*blank\.parquet\) row 2: the label is empty"):
        _tokenised(tmp_path, str(parquet))
    with (tmp_path / "blank.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["text", "label"], ["good", "pos"], ["bad", " "], ["fine", "neg"]])
    with pytest.raises(DataError, match=r"^train \(.*blank\.csv\) row 1: the label is empty"):
        _tokenised(tmp_path, str(tmp_path / "blank.csv"))
    (tmp_path / "cell.csv").write_text("text,label\ngood,pos\nbad,neg\nfine,\n")  # an empty cell: the same line
    with pytest.raises(DataError, match=r"^train \(.*cell\.csv\) row 2: the label is empty; give every label a name$"):
        _tokenised(tmp_path, str(tmp_path / "cell.csv"))
    # a list of labels holding a null or an empty one (multi-label)
    many = [{"text": t, "labels": ["a", "b"]} for t in GOOD]
    many[2]["labels"] = ["a", None]
    with pytest.raises(DataError, match=r"^train \(.*null\.jsonl\) row 2: the label list holds None"):
        _tokenised(tmp_path, _jsonl(tmp_path / "null.jsonl", many), label_column="labels", multi_label=True)
    many[2]["labels"], many[3]["labels"] = ["a"], ["b", " "]
    with pytest.raises(DataError, match=r"^train \(.*item\.jsonl\) row 3: the label list holds an empty label"):
        _tokenised(tmp_path, _jsonl(tmp_path / "item.jsonl", many), label_column="labels", multi_label=True)
    # the tokeniser's own check (the test split is read without tokenising)
    with pytest.raises(DataError, match=r"row 7: the label is empty"):
        tokenise.label_strings(" ", False, "test", "t.jsonl", 7)
    with pytest.raises(DataError, match=r"row 7: the label list holds None"):
        tokenise.label_strings(["a", None], True, "test", "t.jsonl", 7)


def test_every_class_keeps_a_training_document_and_common_data_splits_as_before() -> None:
    texts = [f"document number {i}" for i in range(20)] + ["x one", "x two", "y alone"]
    labels = ["a"] * 20 + ["x", "x", "y"]
    for seed in range(10):  # the old rule (no stratification once a class has one document) lost x or y
        keep, held = stable_holdout(texts, labels, 0.5, seed)
        assert {labels[i] for i in keep} == {"a", "x", "y"} and 22 not in held
        assert len(held) == 12  # as many as before, taken from the classes that can spare them
    # every class with several documents: the rows held out before the change
    texts = [f"document number {i}" for i in range(60)]
    cycle = ["a"] * 30 + ["b"] * 20 + ["c"] * 10
    labels = [cycle[(i * 7) % 60] for i in range(60)]
    assert stable_holdout(texts, labels, 0.1, 42)[1].tolist() == [1, 10, 16, 21, 22, 58]
    assert stable_holdout(texts, None, 0.2, 7)[1].tolist() == [0, 13, 15, 16, 22, 23, 31, 50, 51, 53, 54, 56]


def test_the_ngram_teacher_cross_fits_around_a_single_document_class() -> None:
    texts = [f"wonderful superb film number{i}" for i in range(12)] + [f"dreadful boring film number{i}"
                                                                        for i in range(12)] + ["odd one"]
    labels = torch.tensor([0] * 12 + [1] * 12 + [2])
    mixed = mixed_targets(texts, labels, 3, 0.3, seed=0)
    assert mixed.shape == (25, 3) and torch.allclose(mixed.sum(1), torch.ones(25))
    assert torch.equal(mixed[-1], torch.tensor([0.0, 0.0, 1.0]))  # its label alone
    assert not torch.equal(mixed[:24], torch.nn.functional.one_hot(labels[:24], 3).float())  # the rest mixed
    assert (mixed.argmax(1) == labels).all()
    # 150 of one class and one of another: nothing to cross-fit, the labels stay the targets (no solver error)
    lopsided = torch.tensor([0] * 150 + [1])
    assert torch.equal(mixed_targets([f"w{i}" for i in range(151)], lopsided, 2, 0.3, seed=0), lopsided)


def test_a_class_folder_reads_txt_files_in_any_case(tmp_path: Path) -> None:
    for label, names in {"neg": ["a.TXT", "b.Txt"], "pos": ["c.txt", "d.txt"]}.items():
        (tmp_path / "docs" / label).mkdir(parents=True)
        for name in names:
            (tmp_path / "docs" / label / name).write_text(f"{label} text {name}")
    read = load_source(str(tmp_path / "docs"))
    assert read["label"] == ["neg", "neg", "pos", "pos"] and read["text"][0] == "neg text a.TXT"


def test_rows_without_a_word_are_left_out_with_a_log_line(tmp_path: Path, caplog) -> None:
    records = [{"text": t, "label": "pos" if "good" in t else "neg"} for t in GOOD]
    records[1:1] = [{"text": "   ", "label": "pos"}, {"text": "<br /><br />", "label": "neg"}]
    source = _jsonl(tmp_path / "wordless.jsonl", records)
    logger = logging.getLogger("pytorch_lightning")  # which does not propagate to caplog's root handler
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="pytorch_lightning"):
            kept = _tokenised(tmp_path, source)
    finally:
        logger.removeHandler(caplog.handler)
    assert kept["row"] == [0, 3, 4, 5]
    assert f"train ({source}): 2 of 6 rows have no word and are left out (rows 1, 2)" in caplog.messages


def test_a_csv_with_an_unnamed_column_is_read(tmp_path: Path) -> None:
    frame = pd.DataFrame({"text": GOOD, "label": ["pos", "neg", "pos", "neg"]})
    frame.to_csv(tmp_path / "pandas.csv")  # header ",text,label": the index, unnamed
    (tmp_path / "excel.csv").write_text("text,label,\r\n" + "".join(f"{t},{lab},\r\n" for t, lab in zip(
        ["good film", "bad film", "good plot", "bad plot"], ["pos", "neg", "pos", "neg"], strict=True)))
    for name in ("pandas.csv", "excel.csv"):
        read = load_source(str(tmp_path / name))
        assert read["label"] == ["pos", "neg", "pos", "neg"] and len(read["text"]) == 4
        assert _tokenised(tmp_path, str(tmp_path / name))["target"] == [["pos"], ["neg"], ["pos"], ["neg"]]
    assert load_source(str(tmp_path / "pandas.csv"))["Unnamed: 0"] == ["0", "1", "2", "3"]  # as han-score names it


def test_unicode_digit_labels_sort_as_names(tmp_path: Path) -> None:
    module = HANDataModule(train=str(tmp_path / "unused.jsonl"))
    seen = datasets.Dataset.from_dict({"target": [["②"], ["①"], ["²"], ["10"], ["2"], ["-1"], ["b"]]})
    assert module._collect_labels(seen) == ["-1", "2", "10", "b", "²", "①", "②"]


def test_lists_in_a_csvs_label_cells_are_multi_label(tmp_path: Path) -> None:
    texts = ["oil prices rose", "the bank cut rates", "wheat exports grew", "crude and rates"]
    cells = [["crude"], ["interest"], ["grain"], ["crude", "interest"]]
    pd.DataFrame({"text": texts, "labels": [json.dumps(c) for c in cells]}).to_csv(tmp_path / "json.csv", index=False)
    pd.DataFrame({"text": texts, "labels": cells}).to_csv(tmp_path / "python.csv", index=False)  # ['crude', ...]
    for name in ("json.csv", "python.csv"):
        source = str(tmp_path / name)
        p = profile(source, "text", "labels", None, 0.25, False, None)
        assert p.multi_label and p.labels == 3
        assert _tokenised(tmp_path, source, label_column="labels", multi_label=True)["target"] == cells
    # single labels that merely start with "[" stay single labels
    pd.DataFrame({"text": texts, "label": ["[draft]", "final", "[draft]", "final"]}).to_csv(tmp_path / "one.csv",
                                                                                             index=False)
    p = profile(str(tmp_path / "one.csv"), "text", "label", None, 0.25, False, None)
    assert not p.multi_label and p.labels == 2
    assert np.array_equal(load_source(str(tmp_path / "one.csv"))["label"], ["[draft]", "final", "[draft]", "final"])
