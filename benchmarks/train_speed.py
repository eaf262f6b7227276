"""Training-step speed of the HAN on IMDB: the shipped training path against packed sequences, side by side.

    python benchmarks/train_speed.py                    # 60 batches x 3 rounds, interleaved
    python benchmarks/train_speed.py --batches 100 --rounds 2 --config data/configs/imdb.yaml
    git show e503854:han/model.py > /tmp/previous_model.py      # a third variant: another version's
    python benchmarks/train_speed.py --compare-with /tmp/previous_model.py

Both variants train the same network (same initial weights, AdamW, gradient clipping) on the same
first batches of an epoch of the config's training data (tokenisation from the cache `han-train`
writes; the first run builds it):

- shipped: `han.HAN` as it trains, i.e. sentences sorted into blocks of similar length and run as
  dense GRUs (see `han/model.py`);
- packed: the same network with both GRUs run over `pack_padded_sequence` input, the way public
  PyTorch HAN implementations train.

Prints documents/s for each round, the median, the ratio, and the epoch time each implies for the
config's training split. Rounds alternate between the variants, so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml
from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from han.cpu_kernels import gather_steps, mask, reverse_within
from han.environment import apply_defaults
from han.model import HAN, BiGRU, HANConfig
from training.data import HANDataModule

REPO = Path(__file__).resolve().parent.parent



def packed(rnn: BiGRU, x: Tensor, lengths: Tensor) -> Tensor:
    """Padded in and out, both directions through ``nn.GRU`` over ``pack_padded_sequence`` input."""
    steps = x.shape[1]

    def run(gru: torch.nn.GRU, inputs: Tensor) -> Tensor:
        sequences = pack_padded_sequence(inputs, lengths.cpu(), batch_first=True, enforce_sorted=False)
        return pad_packed_sequence(gru(sequences)[0], batch_first=True, total_length=steps)[0]

    reverse = reverse_within(lengths, steps)
    backward = gather_steps(run(rnn.backward_rnn, gather_steps(x, reverse)), reverse)
    return torch.cat([run(rnn.forward_rnn, x), backward], dim=-1) * mask(lengths, steps).unsqueeze(-1)


class PackedHAN(HAN):
    """The HAN with packed-sequence GRUs in training too (the usual public implementation)."""

    def __init__(self, config: HANConfig) -> None:
        super().__init__(config)
        self.sentence_rnn.forward = functools.partial(packed, self.sentence_rnn)  # type: ignore[method-assign]

    def sentence_vectors(self, words: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        h = packed(self.word_rnn, self.embedding(words), lengths)
        return self.word_attention(h, mask(lengths, words.shape[1]))


def load_han_class(path: Path) -> type[HAN]:
    """The ``HAN`` class of another version of ``han/model.py`` (same constructor and forward)."""
    spec = importlib.util.spec_from_file_location("compared_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.HAN


def time_steps(net: HAN, batches: list, optimizer: torch.optim.Optimizer) -> float:
    """Seconds for forward, backward, clipping and an optimizer step over every batch."""
    loss_fn = torch.nn.CrossEntropyLoss()
    net.train()
    start = time.perf_counter()
    for inputs, target in batches:
        loss = loss_fn(net(*inputs).logits, target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
        optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "data" / "configs" / "imdb.yaml")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--compare-with", type=Path, help="also time the HAN of this model.py (another version)")
    parser.add_argument("--only-shipped", action="store_true", help="time han.HAN alone (benchmarks/contention.py)")
    args = parser.parse_args()
    apply_defaults()
    torch.set_num_threads(args.threads)

    config = yaml.safe_load(args.config.read_text())
    data_args = {k: v for k, v in config["data"].items() if k != "test"}
    os.chdir(REPO)  # the config's paths are relative to the repository
    data = HANDataModule(**data_args)
    data.setup()
    loader = data.train_dataloader()
    batches = [b for _, b in zip(range(args.batches), loader, strict=False)]
    docs = sum(int(target.shape[0]) for _, target in batches)
    words = sum(int(inputs.sentence_lengths.sum()) for inputs, _ in batches)
    model = config["model"]
    han_config = HANConfig(
        vocab_size=len(data.vocab), num_labels=data.num_labels, multi_label=data.multi_label,
        **{k: model[k] for k in ("embed_dim", "word_hidden", "sentence_hidden", "attention_dim", "dropout",
                                 "word_dropout", "sentence_values") if k in model},
    )
    print(f"{args.config.name}: {args.batches} batches of {data_args.get('batch_size')} "
          f"({docs} documents, {words} words), {args.threads} torch threads, torch {torch.__version__}")

    variants: dict[str, type[HAN]] = {"shipped": HAN} if args.only_shipped else {"shipped": HAN, "packed": PackedHAN}
    if args.compare_with:
        variants[args.compare_with.name] = load_han_class(args.compare_with.resolve())
    figures: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        for name, cls in variants.items():
            torch.manual_seed(0)
            net = cls(han_config)
            optimizer = torch.optim.AdamW(net.parameters(), lr=model.get("lr", 3e-3), fused=True)
            seconds = time_steps(net, batches, optimizer)
            figures[name].append(docs / seconds)
            print(f"round {round_}: {name:8s} {docs / seconds:6.1f} docs/s  {words / seconds:8.0f} words/s")

    train_docs = len(data.splits["train"].sizes)
    print(f"\n| variant | docs/s (median of {args.rounds}) | implied epoch of {train_docs} docs |")
    print("| --- | ---: | ---: |")
    for name, values in figures.items():
        rate = statistics.median(values)
        print(f"| {name} | {rate:.0f} | {train_docs / rate:.0f} s |")
    print()
    for name in list(variants)[1:]:
        ratio = statistics.median(figures["shipped"]) / statistics.median(figures[name])
        print(f"shipped / {name}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
