"""The faithfulness part of the evaluation report: every explanation method against a random one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from han.faithfulness import evaluate_faithfulness
from han.pipeline import Pipeline

RUN_KEYS = ("offered", "stopped_by", "budget_seconds", "seconds")  # how many were measured, and why no more
SUMMARY_KEYS = ("comprehensiveness_aopc", "sufficiency_aopc", "top1_sentence_drop", "top1_sentence_flip_rate")


def faithfulness_report(pipeline: Pipeline, texts: list[str], documents: int, tau_documents: int, directory: Path,
                        title: str, seed: int = 0, budget_seconds: float | None = None,
                        progress: Callable[[int], object] | None = None) -> dict[str, Any]:
    """Measure a seeded sample of ``documents`` texts, in the sample's random order so that where
    ``budget_seconds`` stops it early the documents measured are a random sample too (see
    han.faithfulness.evaluate_faithfulness); write faithfulness.json and .png; return a summary."""
    rng = np.random.default_rng(seed)
    sample = [texts[i] for i in rng.choice(len(texts), size=min(documents, len(texts)), replace=False)]
    result = evaluate_faithfulness(pipeline, sample, tau_documents=tau_documents, seed=seed,
                                   budget_seconds=budget_seconds, progress=progress)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "faithfulness.json").write_text(json.dumps(result, indent=2))
    _plot(result, directory / "faithfulness.png", title)
    summary = {method: {k: round(m[k], 4) for k in SUMMARY_KEYS} for method, m in result["methods"].items()}
    for method, m in result["methods"].items():
        if "x_random" in m:
            summary[method]["x_random"] = {key: _rounded(r) for key, r in m["x_random"].items() if key in SUMMARY_KEYS}
    for method, tau in result["kendall_tau"].items():
        if method in summary and tau is not None:
            summary[method]["kendall_tau_vs_leave_one_out"] = round(tau, 4)
    sentences = {k: round(v, 2) for k, v in result["sentences_per_document"].items()}
    run = {k: _round(result[k], 1) for k in RUN_KEYS}
    return {"documents": result["documents"], **run, "sentences_per_document": sentences, "methods": summary}


def _round(value: Any, digits: int) -> Any:
    return round(value, digits) if isinstance(value, float) else value


def _rounded(ratio: dict[str, Any]) -> dict[str, Any]:
    """A ratio and its interval to 2 decimals (the summary travels in the model's metadata)."""
    value, interval = ratio["ratio"], ratio["interval"]
    return {
        "ratio": None if value is None else round(value, 2),
        "interval": None if interval is None else [round(v, 2) for v in interval],
        "confidence": ratio["confidence"],
    }


def _plot(result: dict[str, Any], path: Path, title: str) -> None:
    k = result["k_percent"]
    fig, (comp, suff) = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for method, m in result["methods"].items():
        style = {"color": "grey", "linestyle": "--"} if method == "random" else {"marker": "o"}
        comp.plot(k, m["comprehensiveness"], label=f"{method} (AOPC {m['comprehensiveness_aopc']:.3f})", **style)
        suff.plot(k, m["sufficiency"], label=f"{method} (AOPC {m['sufficiency_aopc']:.3f})", **style)
    comp.set_title("comprehensiveness: drop with the top k% removed (higher is better)", fontsize=9)
    suff.set_title("sufficiency: drop with only the top k% kept (lower is better)", fontsize=9)
    for ax in (comp, suff):
        ax.set_xscale("log")
        ax.set_xticks(k, [f"{x}%" for x in k])
        ax.set_xlabel("words (share of the document)")
        ax.legend(fontsize=7)
    comp.set_ylabel("drop in the predicted label's probability")
    fig.suptitle(f"{title} ({result['documents']} documents)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
