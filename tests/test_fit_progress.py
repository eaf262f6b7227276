"""A fit's slow steps after training say when they start and end, with counts and seconds, in a log
that is not a terminal (no progress bar there); the faithfulness check keeps to its time budget."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from han import SavedModel
from tests.conftest import REPO
from training.cli import main
from training.export import ExportModel

SMOKE = str(REPO / "data" / "configs" / "smoke.yaml")


def test_a_smoke_fit_logs_each_step_and_the_faithfulness_budget(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                               capfd: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Also a fit past the recipe's HASHED_FROM (lowered here): its baseline hashes its n-grams."""
    from training import recipe

    monkeypatch.setattr(recipe, "HASHED_FROM", 10)
    caplog.set_level(logging.INFO)
    root = tmp_path / "run"
    main(["fit", "--config", SMOKE, "--trainer.default_root_dir", str(root), "--data.cache_dir",
          str(tmp_path / "cache")])
    log = caplog.text
    for step in ("calibrating on validation", "evaluating validation", "evaluating test", "baseline scoring validation",
                 "baseline scoring test"):
        assert f"{step}: 32 documents ..." in log, step
        assert re.search(rf"{step}: 32 documents in \d+\.\d s", log), step
    start = re.search(r"faithfulness on test: 24 documents, budget (\d+\.\d) s: 10% of the fit's (\d+) s so far \.\.\.",
                      log)
    assert start, log
    end = re.search(r"faithfulness on test: (\d+) documents in (\d+\.\d) s, stopped by the (budget|count) "
                    r"\(budget (\d+\.\d) s: 10% of the fit's \d+ s so far; 24 sampled\)", log)
    assert end, log
    measured, stopped_by = int(end[1]), end[3]
    assert 20 <= measured <= 24 and (stopped_by == "count") == (measured == 24)
    written = json.loads((root / "report" / "test" / "faithfulness.json").read_text())
    assert (written["documents"], written["stopped_by"], written["offered"]) == (measured, stopped_by, 24)
    assert written["budget_seconds"] == pytest.approx(float(start[1]), abs=0.05)
    summary = SavedModel.load(root / "model").metadata["faithfulness"]
    assert (summary["documents"], summary["stopped_by"]) == (measured, stopped_by)
    assert f"faithfulness on test ({measured} documents)" in log
    assert SavedModel.load(root / "model").metadata["baseline"]["buckets"] == 2**20
    bars = re.findall(r"(?:calibrating|evaluating|faithfulness)[^\n\r]*\d+%\|", capfd.readouterr().err)
    assert not bars, "tqdm draws no bar off a terminal (a log would get a line per refresh)"


def test_the_budget_is_a_positive_share_or_none() -> None:
    assert ExportModel(faithfulness_budget=None).faithfulness_budget is None
    for bad in (0.0, -0.1):
        with pytest.raises(ValueError, match="export.faithfulness_budget must be above 0"):
            ExportModel(faithfulness_budget=bad)
