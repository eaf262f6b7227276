"""Data loading pieces without a Trainer: sources, length-bucketed batches and their DDP sharding."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from tests.conftest import REPO
from training import data as training_data
from training.batches import LengthBucketSampler
from training.data import HANDataModule
from training.sources import DataError, load_source


def test_batches_cover_every_document_once_and_group_similar_lengths() -> None:
    sizes = [random.Random(0).randint(1, 500) for _ in range(1000)]
    sampler = LengthBucketSampler(sizes, batch_size=16, seed=3)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert len(batches) == len(sampler)
    spread = sum(max(sizes[i] for i in b) - min(sizes[i] for i in b) for b in batches) / len(batches)
    assert spread < 60, "a batch should hold documents of similar length (sizes range 1-500)"
    assert list(sampler) != batches, "a new epoch brings a new order"


def test_batches_are_the_list_sorts_batches_in_the_same_order() -> None:
    """The pools are sorted with numpy (a million documents' indices in arrays, not lists): the batches
    are those a stable sort of each pool by length gives, shuffled by the same seeded generator, so a
    seed's epochs stay what they were."""
    import numpy as np

    sizes = [random.Random(2).randint(1, 40) for _ in range(3000)]  # many ties: stability matters
    sampler = LengthBucketSampler(sizes, batch_size=8, seed=7, pool_batches=10)
    rng = np.random.default_rng(7)
    order = rng.permutation(3000)
    pooled = []
    for start in range(0, 3000, 80):
        pool = sorted(order[start : start + 80].tolist(), key=sizes.__getitem__)
        pooled.extend(pool[i : i + 8] for i in range(0, len(pool), 8))
    expected = [pooled[i] for i in rng.permutation(len(pooled))]  # then the batches themselves are shuffled
    got = list(sampler)
    assert got == expected and all(type(i) is int for i in got[0])
    assert got != pooled  # the shuffle of the batches is what the comparison above tells apart


def test_an_encoded_split_is_read_from_an_unnamed_file_and_equals_its_tokens(tmp_path, monkeypatch) -> None:
    """The training split's word ids go to an unnamed file in the cache folder, read memory-mapped, so a
    large corpus costs the page cache and not the process; each document reads back as its tokens."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(3)
    words = ["good", "bad", "plot", "acting", "film", "slow", "great", "boring"]
    texts = [". ".join(" ".join(rng.choices(words, k=rng.randint(1, 9))) for _ in range(rng.randint(1, 4))) + "."
             for _ in range(300)]
    pq.write_table(pa.table({"text": texts, "label": ["pos" if "good" in t else "neg" for t in texts]}),
                   tmp_path / "train.parquet")
    module = HANDataModule(train=str(tmp_path / "train.parquet"), cache_dir=str(tmp_path / "cache"), min_freq=1)
    module.setup()
    train = module.splits["train"]
    assert isinstance(train.ids, np.memmap), "the ids should be read from disk, not held in memory"
    keys = module.split_keys("train")["keys"]
    assert len(train) == len(keys) == 270
    for index in (0, 1, 137, 269):
        (ids, lengths), _ = train[index]
        assert lengths.tolist() == [len(s) for s in keys[index]]
        assert ids.tolist() == [i for sentence in keys[index] for i in module.vocab.encode(sentence)]
    assert train.sizes.tolist() == [sum(len(s) for s in k) for k in keys]
    whole = np.bincount(np.asarray(train.ids), minlength=len(module.vocab))
    assert module.token_counts().sum() == train.sizes.sum() and (module.token_counts() == whole).all()
    monkeypatch.setattr(training_data, "COUNT_CHUNK", 7)  # counted a chunk at a time: the same counts
    assert (module.token_counts() == whole).all()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith("train-")) == [], \
        "the encoded splits leave no file behind"


def test_ddp_ranks_get_disjoint_equal_shares_that_cover_everything() -> None:
    sizes = list(range(1, 1001))
    shares = [list(LengthBucketSampler(sizes, 32, seed=5, rank=r, world_size=3)) for r in range(3)]
    assert len({len(s) for s in shares}) == 1, "every rank must run the same number of steps"
    seen = [i for share in shares for batch in share for i in batch]
    assert set(seen) == set(range(1000))
    assert len(seen) - 1000 < 32 * 3, "only the padding needed to even out the ranks is repeated"
    assert len(shares[0]) == len(LengthBucketSampler(sizes, 32, rank=0, world_size=3))


def test_unreadable_sources_name_the_problem(tmp_path) -> None:
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="bad.parquet: cannot be read as parquet"):
        load_source(str(tmp_path / "bad.parquet"))
    with pytest.raises(DataError, match="missing.jsonl: file not found"):
        load_source(str(tmp_path / "missing.jsonl"))
    (tmp_path / "ragged.csv").write_text("text,label\ngood,pos\nbad,neg,extra,more\n")  # the parser's own words
    with pytest.raises(DataError, match=r"ragged.csv: cannot be read as csv \(.*Expected 2 fields in line 3, saw 4"):
        load_source(str(tmp_path / "ragged.csv"))
    # a bad line past Arrow's first block: named by its line in the file (Arrow counted rows in its block)
    good = "".join(f'{{"text": "review {i} was fine", "label": "pos"}}\n' for i in range(5000))
    for name, bad, why in (("word.jsonl", '"a bare string"', "is not a JSON object"),
                           ("cut.jsonl", '{"text": "cut sh', "is not JSON")):
        (tmp_path / name).write_text(good + bad + "\n")
        with pytest.raises(DataError, match=f"{name}: line 5001 {why}"):
            load_source(str(tmp_path / name))
    (tmp_path / "header.csv").write_text("text,label\n")
    (tmp_path / "empty.jsonl").write_text("")
    for name in ("header.csv", "empty.jsonl"):
        with pytest.raises(DataError, match=f"{name}: the file holds no rows$"):
            load_source(str(tmp_path / name))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="not a .parquet, .csv or .jsonl file"):
        load_source(str(tmp_path / "notes.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="one sub-folder of .txt files per class"):
        load_source(str(tmp_path / "empty"))


def test_a_hub_name_is_tried_offline_and_fails_clearly() -> None:
    with pytest.raises(DataError, match="not loadable as a Hugging Face dataset"):
        load_source("someone/no-such-dataset:test")


def test_validation_is_carved_from_train_stratified_and_seeded(tmp_path) -> None:
    def split(seed: int) -> tuple[list, list, list]:
        dm = HANDataModule(train=str(REPO / "data" / "fixtures" / "reviews.jsonl"), val_fraction=0.25, seed=seed,
                           min_freq=1, cache_dir=str(tmp_path))
        dm.setup()
        targets = dm.splits["train"].targets.tolist(), dm.splits["validation"].targets.tolist()
        return *targets, list(dm.texts("validation"))

    train, val, held = split(1)
    assert len(val) == 8 and val.count(0) == val.count(1) == 4, "stratified: both classes equally held out"
    assert len(train) == 24
    assert split(1) == (train, val, held)
    assert sorted(split(2)[2]) != sorted(held), "another seed holds out other documents"


def test_a_large_split_is_tokenised_by_all_cores_the_same_as_by_one(tmp_path, monkeypatch) -> None:
    """6,000 rows: two tokenising processes give the same documents in the same order as one, and a
    bad row is named by its row in the file, not in a process's share."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training import tokenise

    words = ["good", "bad", "plot", "acting", "film", "slow", "great", "boring"]
    rng = random.Random(1)
    texts = [f"{' '.join(rng.choices(words, k=6))}. {' '.join(rng.choices(words, k=4))}!" for _ in range(6000)]
    texts[17] = "   "  # no words: dropped, in both
    labels = ["pos" if "good" in t else "neg" for t in texts]
    pq.write_table(pa.table({"text": texts, "label": labels}), tmp_path / "train.parquet")
    source = str(tmp_path / "train.parquet")
    real = tokenise.processes
    assert real(500) is None  # a small split stays in this process
    got = {}
    for processes in (None, 2):
        monkeypatch.setattr(tokenise, "processes", lambda rows, p=processes: p)
        module = HANDataModule(train=source, test=None, cache_dir=str(tmp_path / f"cache-{processes}"))
        ds = module._tokenised("train", source, None)
        got[processes] = (ds["text"], ds["keys"], ds["target"])
    assert len(got[None][0]) == 5999 and got[None] == got[2]

    texts[4321] = None
    pq.write_table(pa.table({"text": texts, "label": labels}), tmp_path / "bad.parquet")
    module = HANDataModule(train=str(tmp_path / "bad.parquet"), test=None, cache_dir=str(tmp_path / "cache-bad"))
    with pytest.raises(DataError, match=r"row 4321: the text is NoneType, not a string"):
        module._tokenised("train", str(tmp_path / "bad.parquet"), None)
    # named before the tokenising processes start: an error raised in one could hang the pool's exit
    texts[4321], labels[99] = "fine", None
    pq.write_table(pa.table({"text": texts, "label": labels}), tmp_path / "bad-label.parquet")
    module = HANDataModule(train=str(tmp_path / "bad-label.parquet"), test=None, cache_dir=str(tmp_path / "c"))
    with pytest.raises(DataError, match=r"row 99: a label must be a string or an integer, not None"):
        module._tokenised("train", str(tmp_path / "bad-label.parquet"), None)


def test_the_test_split_is_read_without_tokens_as_tokenising_would_keep_it(tmp_path) -> None:
    """``fit`` scores the test split through the pipeline, so it is not tokenised up front; the rows
    kept, their texts and targets are those tokenising keeps, and Lightning's test loop still gets tokens."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    train = ["a good film. really good", "a bad film, bad acting", "good plot", "bad plot and slow"] * 4
    pq.write_table(pa.table({"text": train, "label": ["pos", "neg"] * 8}), tmp_path / "train.parquet")
    test = ["good", "   \n\t ", "<br /><br />", "\x00\x01 \u200b", "", " " * 40 + "bad", "bad\u00a0plot", "\u3000",
            "\u200bok\x00", "x" * 40]
    pq.write_table(pa.table({"text": test, "label": ["pos", "neg"] * 5}), tmp_path / "test.parquet")
    module = HANDataModule(train=str(tmp_path / "train.parquet"), test=str(tmp_path / "test.parquet"), min_freq=1,
                           max_chars=30, cache_dir=str(tmp_path / "cache"))
    module.setup()
    read = (module.texts("test"), module.splits["test"].targets.tolist())
    tokenised = module._tokenised("test", str(tmp_path / "test.parquet"), None)
    assert read[0] == tokenised["text"] == ["good", "bad\u00a0plot", "\u200bok\x00", "x" * 40]
    assert read[1] == [0 if t == ["neg"] else 1 for t in tokenised["target"]] == [1, 1, 1, 0]
    loader = module.test_dataloader()
    assert module.texts("test") == read[0] and module.splits["test"].targets.tolist() == read[1]
    assert sum(len(batch[1]) for batch in loader) == 4

    # past the first 2000 rows, rows are the file's: a row without a word before them shifted every later
    # row's number (the row column predict writes, and the rows errors name)
    many = ["   " if k in (1, 2) else "good" for k in range(2500)]
    pq.write_table(pa.table({"text": many, "label": ["pos"] * 2500}), tmp_path / "many.parquet")
    rows = module._texts("test", str(tmp_path / "many.parquet"), None)["row"]
    assert rows[:2] == [0, 3] and rows[-1] == 2499 and len(rows) == 2498
    pq.write_table(pa.table({"text": ["good"] * 2500, "label": ["pos"] * 2499 + [None]}), tmp_path / "last.parquet")
    with pytest.raises(DataError, match="row 2499: a label must be a string or an integer, not None"):
        module._texts("test", str(tmp_path / "last.parquet"), None)

    pq.write_table(pa.table({"text": ["good", "fine"], "label": ["pos", "meh"]}), tmp_path / "other.parquet")
    other = HANDataModule(train=str(tmp_path / "train.parquet"), test=str(tmp_path / "other.parquet"),
                          cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError) as unknown:
        other.setup()
    assert str(unknown.value) == (f"test ({tmp_path / 'other.parquet'}) row 1: label 'meh' does not occur in the "
                                  "training labels (neg, pos)")


def test_the_validation_split_keeps_a_documents_side_as_the_labelled_set_grows(tmp_path: Path) -> None:
    """Rounds of labelling: each fit holds out its validation split from a larger set, warm-started from
    the last round's model. A document the last fit trained on must not be validated on now: sides are
    decided by each text's hash, so only a few at the per-class boundaries can change sides."""
    import json

    rng = random.Random(0)
    words = ["good", "bad", "plot", "acting", "score", "dull", "great", "long", "fun", "slow"]
    rows = [{"text": " ".join(rng.choice(words) for _ in range(8)) + f" review {i}.", "label": ["neg", "pos"][i % 2]}
            for i in range(1200)]
    sides = []
    for n in (1000, 1200):
        path = tmp_path / f"labelled-{n}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows[:n]))
        data = HANDataModule(str(path), val_fraction=0.1, min_freq=1, cache_dir=str(tmp_path / "cache"))
        data.setup()
        sides.append((set(data.texts("train")), set(data.texts("validation"))))
        assert len(sides[-1][1]) == math.ceil(n * 0.1)
    (trained, _), (_, validated) = sides
    assert len(validated & trained) <= 0.05 * len(validated)  # a random split each time: about 75% of them


def test_a_csv_is_read_as_written(tmp_path: Path) -> None:
    """pandas' guesses, as datasets' CSV reader makes them: a review reading "NA" was a missing text (the fit
    refused its row), and labels 0/1 with one row unlabelled became "0.0" and "1.0"."""
    import csv

    path = tmp_path / "train.csv"
    rows = [("NA" if i == 0 else f"review number {i} was {'good' if i % 2 else 'bad'}.", "" if i == 1 else i % 2)
            for i in range(12)]
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *rows])
    table = load_source(str(path))
    assert table["text"][0] == "NA" and table["label"][:3] == ["0", None, "0"]
    with path.open("w", newline="") as f:  # every row labelled, as a training file's must be
        csv.writer(f).writerows([("text", "label"), *((text, i % 2) for i, (text, _) in enumerate(rows))])
    data = HANDataModule(str(path), val_fraction=0.25, min_freq=1, cache_dir=str(tmp_path / "cache"))
    data.setup()
    assert data.label_names == ["0", "1"]
    assert "NA" in set(data.texts("train")) | set(data.texts("validation"))
