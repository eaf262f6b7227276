"""Training-step speed of the HAN on IMDB: the shipped training path against packed sequences, side by side.

    python benchmarks/train_speed.py                    # 60 batches x 3 rounds, interleaved
    python benchmarks/train_speed.py --batches 100 --rounds 2 --config data/configs/imdb.yaml
    git worktree add /tmp/prev HEAD~1                  # a third variant: another checkout's han.HAN
    python benchmarks/train_speed.py --compare-with /tmp/prev

The variants train the same network (same initial weights, AdamW, gradient clipping) on the same
first batches of an epoch of the config's training data (tokenisation from the cache `han-train`
writes; the first run builds it):

- shipped: `han.HAN` as it trains (see `han/cpu_kernels.py`);
- packed: the same network with both GRUs run through `nn.GRU` over `pack_padded_sequence` input, the
  way public PyTorch HAN implementations train;
- the checkout given to `--compare-with`: its `han.HAN`, timed by this script in a process of its own
  with that checkout first on the import path.

Prints documents/s for each round, the median, the ratio, and the epoch time each implies for the
config's training split. Rounds alternate between the variants, so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml
from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from han.cpu_kernels import mask
from han.environment import apply_defaults
from han.model import HAN, BiGRU, HANConfig
from training.data import HANDataModule

REPO = Path(__file__).resolve().parent.parent



def gather_steps(x: Tensor, index: Tensor) -> Tensor:
    return torch.gather(x, 1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def nn_gru_both_ways(rnn: BiGRU, x: Tensor, lengths: Tensor) -> Tensor:
    """Padded in and out, both directions through ``nn.GRU`` itself over ``pack_padded_sequence`` input,
    zero past each length (also the reference tests/test_model.py checks ``han.cpu_kernels`` against)."""
    steps = x.shape[1]
    positions = torch.arange(steps)
    reverse = torch.where(positions < lengths.unsqueeze(1), lengths.unsqueeze(1) - 1 - positions, positions)

    def run(gru: torch.nn.GRU, inputs: Tensor) -> Tensor:
        sequences = pack_padded_sequence(inputs, lengths.cpu(), batch_first=True, enforce_sorted=False)
        return pad_packed_sequence(gru(sequences)[0], batch_first=True, total_length=steps)[0]

    backward = gather_steps(run(rnn.backward_rnn, gather_steps(x, reverse)), reverse)
    return torch.cat([run(rnn.forward_rnn, x), backward], dim=-1) * mask(lengths, steps).unsqueeze(-1)


class PackedHAN(HAN):
    """The HAN with nn.GRU over packed sequences in training (the usual public implementation).

    ``HAN.forward`` runs the word level through ``sentence_vectors`` and the document level through
    ``_document_level`` (which ``classify`` calls too); both are replaced here, padded in and out, and
    ``_document_level`` returns the sentence values flat ([sentences, dim]) as ``HAN``'s does."""

    def sentence_vectors(self, words: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        h = nn_gru_both_ways(self.word_rnn, self.embed(words), lengths)
        return self.word_attention(h, mask(lengths, words.shape[1]))

    def _document_level(self, grouped: Tensor, document_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        valid = mask(document_lengths, grouped.shape[1])
        g = nn_gru_both_ways(self.sentence_rnn, grouped, document_lengths)
        values = grouped if self.config.sentence_values == "own" else g
        document_vectors, sentence_weights = self.sentence_attention(g, valid, values)
        return self.head(self.dropout(document_vectors)), sentence_weights, values[valid]


def checkout_rate(checkout: Path, args: argparse.Namespace) -> float:
    """docs/s of another checkout's han.HAN: this script, one round of it alone, with that checkout first
    on the import path (it needs ``han.cpu_kernels.mask`` and ``han.environment``, as mains since
    2026-11-25 have)."""
    command = [sys.executable, __file__, "--only-shipped", "--rounds", "1", "--config", str(args.config),
               "--batches", str(args.batches), "--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"{checkout}'s han.HAN did not run (exit {run.returncode}):\n{run.stderr[-3000:]}")
    loaded = re.search(r"han from (\S+)", run.stdout)
    if loaded is None or not Path(loaded.group(1)).resolve().is_relative_to(checkout):
        raise SystemExit(f"{checkout} has no han package of its own: the run imported {loaded and loaded.group(1)}")
    found = re.search(r"shipped\s+([\d.]+) docs/s", run.stdout)
    if found is None:
        raise SystemExit(f"no docs/s in the output of {checkout}:\n{run.stdout}")
    return float(found.group(1))


def time_steps(net: HAN, batches: list, optimizer: torch.optim.Optimizer) -> float:
    """Seconds for forward, backward, clipping and an optimizer step over every batch, after one untimed
    forward and backward (a checkout's variant runs in a fresh process; the weights stay as they were)."""
    loss_fn = torch.nn.CrossEntropyLoss()
    net.train()
    inputs, target = batches[0]
    loss_fn(net(*inputs).logits, target).backward()
    net.zero_grad(set_to_none=True)
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
    parser.add_argument("--compare-with", type=Path, help="also time the han.HAN of this checkout (another version)")
    parser.add_argument("--only-shipped", action="store_true", help="time han.HAN alone (benchmarks/contention.py)")
    args = parser.parse_args()
    args.config = args.config.resolve()  # before the chdir below
    if args.compare_with:
        args.compare_with = args.compare_with.resolve()
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
    print(f"han from {Path(sys.modules['han'].__file__).parent}")  # checked by checkout_rate
    print(f"{args.config.name}: {args.batches} batches of {data_args.get('batch_size')} "
          f"({docs} documents, {words} words), {args.threads} torch threads, torch {torch.__version__}")

    variants: dict[str, type[HAN]] = {"shipped": HAN} if args.only_shipped else {"shipped": HAN, "packed": PackedHAN}
    names = [*variants, *([f"{args.compare_with.name} (checkout)"] if args.compare_with else [])]
    figures: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names:
            if name in variants:
                torch.manual_seed(0)
                net = variants[name](han_config)
                optimizer = torch.optim.AdamW(net.parameters(), lr=model.get("lr", 3e-3), fused=True)
                rate = docs / time_steps(net, batches, optimizer)
            else:
                rate = checkout_rate(args.compare_with, args)
            figures[name].append(rate)
            print(f"round {round_}: {name:8s} {rate:6.1f} docs/s  {words * rate / docs:8.0f} words/s", flush=True)

    train_docs = len(data.splits["train"].sizes)
    print(f"\n| variant | docs/s (median of {args.rounds}) | implied epoch of {train_docs} docs |")
    print("| --- | ---: | ---: |")
    for name, values in figures.items():
        rate = statistics.median(values)
        print(f"| {name} | {rate:.0f} | {train_docs / rate:.0f} s |")
    print()
    for name in names[1:]:
        ratio = statistics.median(figures["shipped"]) / statistics.median(figures[name])
        print(f"shipped / {name}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
