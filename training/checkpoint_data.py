"""What a checkpoint's word ids and label indices mean, recorded at save and checked at load.

``han-train test/validate/predict --ckpt_path`` build the vocabulary again from the data given then: a
training file grown by a labelling round (or a self-training fit's unlabelled text) gives other words at
the same ids, and the checkpoint's weights then score silently wrong (or, at another size, fail with a
size-mismatch traceback).
"""

from __future__ import annotations

import hashlib
from typing import Any


def data_fingerprint(data: Any) -> dict[str, Any] | None:
    """The data module's vocabulary (size, digest of its words in id order) and labels; None before setup."""
    if data is None or getattr(data, "vocab", None) is None or not getattr(data, "label_names", None):
        return None
    words = data.vocab.itos
    digest = hashlib.sha256("\n".join(words).encode("utf-8", "surrogatepass")).hexdigest()
    return {"words": len(words), "digest": digest, "labels": list(data.label_names)}


# A checkpoint with no record of its data comes from an earlier release, which held out a validation split from
# the training file in another way (training.splits): the same settings then give other words.
_EARLIER = ("; this checkpoint, from an earlier release, records no data: without --data.validation that release "
            "held out another validation split from the training file, so only that release can resume or test it")


def warm_started_architecture(module: Any) -> dict[str, Any] | None:
    """What a warm-started fit's checkpoint must carry to be tested or used without its ``init_from`` model:
    the network's sizes and sentence values (taken from that model, not from the run's settings) and the
    data's language. None for a fit from scratch, whose settings already say all of it."""
    if not module.hparams.get("init_from"):
        return None
    config = module.net.config
    data = getattr(module.trainer, "datamodule", None)
    return {"embed_dim": config.embed_dim, "word_hidden": config.word_hidden,
            "sentence_hidden": config.sentence_hidden, "attention_dim": config.attention_dim,
            "sentence_values": config.sentence_values,
            "language": getattr(getattr(data, "hparams", None), "language", None) if data is not None else None}


def check_same_data(checkpoint: dict[str, Any], data: Any, sentence_values: str) -> None:
    """ValueError (one line) when ``checkpoint`` was fitted on other words or labels than ``data`` gives now
    (a checkpoint from before the record: by its embedding's size alone), or with other sentence values: one
    from before that setting existed was trained "contextual", and with equal hidden sizes its head would
    also fit an "own" network, and load silently into the wrong one."""
    stored = (checkpoint.get("han_architecture") or checkpoint.get("hyper_parameters", {})).get("sentence_values",
                                                                                              "contextual")
    if stored != sentence_values:
        raise ValueError(f"the checkpoint was trained with model.sentence_values={stored}, this run has "
                         f"{sentence_values} (set --model.sentence_values {stored})")
    now = data_fingerprint(data)
    if now is None:
        return
    before = checkpoint.get("han_data")
    embedding = checkpoint.get("state_dict", {}).get("net.embedding.weight")
    rows = None if embedding is None else int(embedding.shape[0])
    if (before is None or before == now) and (rows is None or rows == now["words"]):
        return
    words = before["words"] if before else rows
    same = " of other words" if words == now["words"] and before and before["labels"] == now["labels"] else ""
    labels = ", ".join(before["labels"]) if before else "(not recorded)"
    raise ValueError(f"the checkpoint's fit read other data ({words:,} words; labels {labels}) than this run's "
                     f"data gives ({now['words']:,} words{same}; labels {', '.join(now['labels'])}), so its word ids "
                     "would mean other words: pass the fit's --data settings and training file as they were, or use "
                     "the exported model (--model.init_from runs/NAME/model)" + ("" if before else _EARLIER))
