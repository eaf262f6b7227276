"""Token vocabulary: built from training documents, saved as JSON."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

PAD = "<pad>"
UNK = "<unk>"


class Vocabulary:
    """Maps token keys to ids. Id 0 is padding, id 1 the unknown token; look-up is a dict."""

    pad_id = 0
    unk_id = 1

    def __init__(self, tokens: Iterable[str]) -> None:
        self.itos: list[str] = [PAD, UNK]
        for token in tokens:
            if token not in (PAD, UNK):
                self.itos.append(token)
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocabulary tokens must be unique")

    @classmethod
    def build(
        cls, documents: Iterable[Iterable[Iterable[str]]], min_freq: int = 2, max_size: int | None = 50_000
    ) -> Vocabulary:
        """Build from documents given as sentences of token keys.

        Keeps tokens seen at least ``min_freq`` times, the most frequent first, at most
        ``max_size`` entries in all (padding and unknown included); ties break alphabetically
        so the same data always gives the same vocabulary.
        """
        counts: Counter[str] = Counter()
        for document in documents:
            for sentence in document:
                counts.update(sentence)
        ranked = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        if max_size is not None:
            ranked = ranked[: max(0, max_size - 2)]
        return cls(ranked)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Ids of the tokens, unknown ones mapped to ``unk_id``."""
        get, unk = self.stoi.get, self.unk_id
        return [get(t, unk) for t in tokens]

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"tokens": self.itos}, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        tokens = data["tokens"] if isinstance(data, dict) else None
        if not isinstance(tokens, list) or tokens[:2] != [PAD, UNK] or not all(isinstance(t, str) for t in tokens):
            raise ValueError(f"{path}: not a vocabulary (expected {{'tokens': ['{PAD}', '{UNK}', ...]}})")
        return cls(tokens[2:])
