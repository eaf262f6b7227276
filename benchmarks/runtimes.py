"""The no-gradient forward in this project's kernels against the same model in ONNX Runtime and OpenVINO.

    .venv/bin/python -m venv /tmp/rt-venv && /tmp/rt-venv/bin/pip install onnxruntime openvino onnx  # not our pins
    .venv/bin/python benchmarks/runtimes.py                  # han-imdb:production, 2,000 IMDB test reviews
    .venv/bin/python benchmarks/runtimes.py --reviews 200 --rounds 2 --engines onnxruntime   # a try-out

A runtime becomes a dependency only if it wins by 1.3x or more end to end, gives the same labels, keeps
scores and attention weights within 1e-4 and keeps the worker's memory goal (the issue). So, on the same
reviews segmented and encoded once by ``Pipeline`` and batched as it batches them (64 documents, its
token cap), each engine runs the network (collation included) and ``Pipeline.__call__`` end to end (its
``forward`` swapped for the engine's), with 1 then 2 threads, each in a worker-like process of its own
(``tune_process``: in one process the runtimes' thread pools, OpenVINO's pinned to cores, slowed torch's
2 threads many times over), rounds in turn (order reversed every other round): median docs/s and the
median of each round's ratio to the project. Engines:

- ``project``: ``Pipeline.forward``, the model in ``han.numpy_forward`` (packed, real positions only);
- ``torch-padded``: ``Padded`` run by PyTorch, eager ``nn.GRU`` over padded batches (what the toy that
  measured ONNX Runtime 1.4-1.5x and OpenVINO 2.2-2.5x compared against);
- ``onnxruntime``, ``openvino``: ``Padded`` exported once (``torch.onnx.export``, the TorchScript
  exporter, dynamic axes), the same file; ``openvino-bf16`` (asked for only): OpenVINO's default
  precision on CPUs with bf16 units, which the 1e-4 rule rules out.

``Padded`` has the model's own weights. Each BiGRU is its two one-way ``nn.GRU`` (ONNX GRU ops), the
backward one reading each sequence reversed within its length (a gather). An ONNX GRU given
``sequence_lens`` does that itself, but OpenVINO 2026.4's CPU plugin then reverses the whole padded row,
padding first (attention weights off by 0.2-0.5); given them, the one-way GRUs were ~10% faster in ONNX
Runtime and no faster in OpenVINO, not worth the export's sorted example. Agreement is checked in this
process before timing. RSS: each worker's increase over its pipeline and reviews, after loading its
engine and after one network pass. Runtimes are imported from ``--site`` (a scratch venv's
site-packages, appended to sys.path); an engine whose package is missing is skipped with a line saying
so. The runtimes see the same batch shapes every round (OpenVINO caches per shape); a worker's vary.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import psutil
import torch
from torch import Tensor, nn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from han.batch import collate_flat, length_sorted_chunks  # noqa: E402
from han.cpu_kernels import mask  # noqa: E402
from han.environment import apply_defaults, release_free_memory, tune_process  # noqa: E402
from han.model import HAN, Attention, BiGRU  # noqa: E402
from han.numpy_forward import Forward as Output  # noqa: E402
from han.pipeline import Encoded, Pipeline  # noqa: E402

DATA = REPO.parent / "shared" / "datasets" / "imdb" / "test.parquet"
SITE = Path(f"/tmp/rt-venv/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages")
ENGINES = ("project", "torch-padded", "onnxruntime", "openvino")
PACKAGE = {"onnxruntime": "onnxruntime", "openvino": "openvino", "openvino-bf16": "openvino"}
INPUTS = ("words", "sentence_lengths", "sentence_index")
OUTPUTS = ("logits", "word_weights", "sentence_weights")
AXES = {"words": {0: "sentences", 1: "words"}, "sentence_lengths": {0: "sentences"},
        "sentence_index": {0: "documents", 1: "max_sentences"}, "logits": {0: "documents"},
        "word_weights": {0: "documents", 1: "max_sentences", 2: "words"},
        "sentence_weights": {0: "documents", 1: "max_sentences"}}
Forward = Callable[[Sequence[Encoded]], Iterator[tuple[list[int], Output]]]
Run = Callable[[dict[str, np.ndarray]], Sequence[np.ndarray | Tensor]]


def bigru(rnn: BiGRU, x: Tensor, lengths: Tensor) -> Tensor:
    """x [rows, steps, dim] -> [rows, steps, 2*hidden] at the real positions, as ``BiGRU`` (padding is
    read after a row's real positions only, never before them)."""
    steps = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    last = lengths.unsqueeze(1) - 1
    back = torch.where(steps <= last, last - steps, steps).unsqueeze(-1)  # reversed within the length
    forward = rnn.forward_rnn(x)[0]
    backward = rnn.backward_rnn(x.gather(1, back.expand(-1, -1, x.shape[2])))[0]
    return torch.cat([forward, backward.gather(1, back.expand(-1, -1, backward.shape[2]))], -1)


def attend(attention: Attention, h: Tensor, real: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    scores = torch.tanh(attention.proj(h)) @ attention.context
    weights = torch.softmax(scores.masked_fill(~real, float("-inf")), -1)
    return torch.bmm(weights.unsqueeze(1), values).squeeze(1), weights


class Padded(nn.Module):
    """The model's no-gradient forward over padded tensors, in operations ONNX has. Inputs: the flat
    batch's words and sentence lengths, and sentence_index [docs, max_sentences], each document's rows
    of it (-1: padding). Outputs as ``HANOutput``."""

    def __init__(self, model: HAN) -> None:
        super().__init__()
        self.model = model

    def forward(self, words: Tensor, sentence_lengths: Tensor, sentence_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        m = self.model
        h = bigru(m.word_rnn, m.embedding(words), sentence_lengths)
        vectors, word_weights = attend(m.word_attention, h, mask(sentence_lengths, words.shape[1]), h)
        real = sentence_index >= 0
        at = sentence_index.clamp(min=0)
        grouped = vectors[at]
        g = bigru(m.sentence_rnn, grouped, real.sum(1))
        document, sentence_weights = attend(m.sentence_attention, g, real,
                                            grouped if m.config.sentence_values == "own" else g)
        return m.head(document), word_weights[at].masked_fill(~real.unsqueeze(-1), 0.0), sentence_weights


def feed(encoded: Sequence[Encoded]) -> dict[str, np.ndarray]:
    words, sentence_lengths, document_lengths = (t.numpy() for t in collate_flat(encoded))
    starts = np.cumsum(document_lengths) - document_lengths
    at = np.arange(document_lengths.max())
    index = np.where(at < document_lengths[:, None], starts[:, None] + at, -1)
    return {"words": words, "sentence_lengths": sentence_lengths, "sentence_index": index}


def export(model: HAN, example: dict[str, np.ndarray], path: Path) -> Path:
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation and tracer warnings
        warnings.simplefilter("ignore")
        torch.onnx.export(Padded(model).eval(), tuple(torch.from_numpy(example[k]) for k in INPUTS), str(path),
                          dynamo=False, opset_version=17, input_names=INPUTS, output_names=OUTPUTS,
                          dynamic_axes=AXES)
    return path


def runtime(name: str, model: HAN, onnx: Path, threads: int) -> Run:
    """One batch's outputs from the named engine (not ``project``), computing with ``threads`` threads."""
    if name == "torch-padded":
        padded = Padded(model).eval()

        def run_padded(inputs: dict[str, np.ndarray]) -> Sequence[Tensor]:
            with torch.inference_mode():
                return padded(*(torch.from_numpy(inputs[k]) for k in INPUTS))

        return run_padded
    if name == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(str(onnx), options, providers=["CPUExecutionProvider"])
        return lambda inputs: session.run(None, inputs)
    import openvino as ov

    compiled = ov.Core().compile_model(str(onnx), "CPU", {
        "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "bf16" if name == "openvino-bf16" else "f32"})
    request = compiled.create_infer_request()

    def run_openvino(inputs: dict[str, np.ndarray]) -> Sequence[np.ndarray]:
        result = request.infer(inputs)
        return [result[output] for output in compiled.outputs]

    return run_openvino


def batched(run: Run, pipeline: Pipeline) -> Forward:
    """``Pipeline.forward`` (explain=False) with ``run`` computing each batch."""

    def forward(encoded: Sequence[Encoded], method: str = "attention",
                head: np.ndarray | None = None) -> Iterator[tuple[list[int], Output]]:
        assert method == "attention", "no-gradient forward only"
        sizes = [len(ids) for ids, _ in encoded]
        for chunk in length_sorted_chunks(sizes, pipeline.batch_size, pipeline.max_batch_tokens):
            logits, word_weights, sentence_weights = (np.asarray(t) for t in run(feed([encoded[i] for i in chunk])))
            yield chunk, Output(logits, word_weights, sentence_weights, None)

    return forward


def engine(name: str, pipeline: Pipeline, onnx: Path, threads: int) -> Forward:
    original = Pipeline.forward.__get__(pipeline)
    return original if name == "project" else batched(runtime(name, pipeline.model, onnx, threads), pipeline)


def network_pass(forward: Forward, encoded: Sequence[Encoded]) -> float:
    start = time.perf_counter()
    for _ in forward(encoded):
        pass
    return time.perf_counter() - start


def end_to_end(pipeline: Pipeline, forward: Forward, texts: list[str]) -> tuple[float, list[str]]:
    """``Pipeline.__call__`` (explain=False) with ``forward`` in place of its own: seconds, labels."""
    pipeline.forward = forward  # type: ignore[method-assign]  # an instance attribute: _run calls self.forward
    try:
        start = time.perf_counter()
        results = pipeline(texts)
        return time.perf_counter() - start, [r.label for r in results]
    finally:
        del pipeline.forward


def agreement(pipeline: Pipeline, forward: Forward, reference: list[tuple[list[int], Output]],
              encoded: Sequence[Encoded], head: np.ndarray | None) -> list[float | int]:
    """Max abs difference of logits, scores (calibrated, as served), word and sentence weights from the
    project's forward, and the documents whose chosen labels differ."""
    worst, differ = [0.0] * 4, 0
    for (chunk, ours), (same, theirs) in zip(reference, forward(encoded), strict=True):
        assert chunk == same
        mix = None if head is None else head[chunk]
        scores = pipeline.scores(ours.logits, mix), pipeline.scores(theirs.logits, mix)
        pairs = [(ours.logits, theirs.logits), scores, (ours.word_weights, theirs.word_weights),
                 (ours.sentence_weights, theirs.sentence_weights)]
        for k, (a, b) in enumerate(pairs):
            assert a.shape == b.shape, (OUTPUTS, a.shape, b.shape)
            worst[k] = max(worst[k], float(np.abs(a.astype(np.float64) - b).max()))
        differ += sum(pipeline.decide(a.tolist(), False).labels != pipeline.decide(b.tolist(), False).labels
                      for a, b in zip(*scores, strict=True))
    return [*worst, differ]


def write_reviews(work: Path, texts: list[str], encoded: Sequence[Encoded]) -> None:
    """The reviews and their encoding, for the worker processes (JSON and arrays: no pickle)."""
    (work / "reviews.json").write_text(json.dumps(texts))
    np.savez(work / "encoded.npz", ids=np.concatenate([ids for ids, _ in encoded]),
             lengths=np.concatenate([lengths for _, lengths in encoded]),
             words=[len(ids) for ids, _ in encoded], sentences=[len(lengths) for _, lengths in encoded])


def read_reviews(work: Path) -> tuple[list[str], list[Encoded]]:
    stored = np.load(work / "encoded.npz")
    ids = np.split(stored["ids"], np.cumsum(stored["words"])[:-1])
    lengths = np.split(stored["lengths"], np.cumsum(stored["sentences"])[:-1])
    return json.loads((work / "reviews.json").read_text()), list(zip(ids, lengths, strict=True))


def rss_mb() -> float:
    """This process's RSS in MiB."""
    release_free_memory()
    return psutil.Process().memory_info().rss / 2**20


def worker(args: argparse.Namespace) -> None:
    """``--worker NAME``: one engine in a process of its own. Replies with its RSS readings, then to each
    line read with the seconds of a network pass and of ``Pipeline.__call__``, and the labels."""
    from model_store import load

    threads = args.threads[0]
    tune_process(threads)
    pipeline = Pipeline(load(args.model))
    texts, encoded = read_reviews(args.work)
    base = rss_mb()
    forward = engine(args.worker, pipeline, args.work / "han.onnx", threads)
    loaded = rss_mb()
    network_pass(forward, encoded)
    memory = {"base": base, "loaded": loaded - base, "used": rss_mb() - base}
    end_to_end(pipeline, forward, texts)  # warms the word-id and n-gram caches
    print(json.dumps(memory), flush=True)
    for _ in sys.stdin:
        network = network_pass(forward, encoded)
        seconds, labels = end_to_end(pipeline, forward, texts)
        print(json.dumps({"network": network, "end_to_end": seconds, "labels": labels}), flush=True)


def reply(process: subprocess.Popen) -> dict:
    line = process.stdout.readline()  # type: ignore[union-attr]
    return json.loads(line) if line else sys.exit(f"a worker ended without a reply: {process.args}")


def measure(args: argparse.Namespace, names: list[str], threads: int, n: int) -> dict[str, dict]:
    """Rounds in turn over one worker process per engine; prints the table, returns the RSS readings."""
    workers, memory = {}, {}
    for name in names:  # started one at a time: a loading process would slow the others' warm-up
        workers[name] = subprocess.Popen(
            [sys.executable, __file__, "--worker", name, "--threads", str(threads), "--model", args.model,
             "--site", str(args.site), "--work", str(args.work)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        memory[name] = reply(workers[name])
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    labels = {}
    try:
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                workers[name].stdin.write("go\n")  # type: ignore[union-attr]
                workers[name].stdin.flush()  # type: ignore[union-attr]
                r = reply(workers[name])
                times[name].append((r["network"], r["end_to_end"]))
                labels[name] = r["labels"]
    finally:
        for process in workers.values():
            process.stdin.close()  # type: ignore[union-attr]
            process.wait()
    print(f"\n{threads} thread(s), {n:,} reviews, median of {args.rounds} rounds in turn, each engine in its own "
          f"process (load average {os.getloadavg()[0]:.2f})")
    print(f"{'engine':<15}{'network docs/s':>16}{'x project':>11}{'end to end docs/s':>19}{'x project':>11}")
    for name in names:
        cells = ""
        for k in (0, 1):
            rate = statistics.median(n / t[k] for t in times[name])
            ratio = statistics.median(p[k] / t[k] for t, p in zip(times[name], times["project"], strict=True))
            cells += f"{rate:>{16 + 3 * k}.1f}{ratio:>10.2f}x"
        print(f"{name:<15}{cells}")
    differ = {n: sum(a != b for a, b in zip(labels[n], labels["project"], strict=True)) for n in names[1:]}
    print("end-to-end labels differing from the project's: " + ", ".join(f"{n} {d}" for n, d in differ.items()))
    return memory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="han-imdb:production", help="a model store tag")
    parser.add_argument("--data", type=Path, default=DATA, help="Parquet with a text column")
    parser.add_argument("--reviews", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=[*ENGINES, "openvino-bf16"])
    parser.add_argument("--site", type=Path, default=SITE, help="site-packages holding the runtimes")
    parser.add_argument("--work", type=Path, help="for the exported model and the reviews (default: a temp dir)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    apply_defaults()
    if args.site.is_dir():
        sys.path.append(str(args.site))
    if args.worker:
        worker(args)
        return 0
    names = ["project"]
    for name in args.engines:
        missing = [p for p in (PACKAGE[name], "onnx") if importlib.util.find_spec(p) is None] if name in PACKAGE else []
        if missing:  # onnx: torch.onnx.export needs it
            print(f"{name}: skipped, {' and '.join(missing)} not installed (looked in {args.site} too)")
        elif name not in names:
            names.append(name)
    versions = {"torch": torch.__version__} | {
        PACKAGE[n]: importlib.import_module(PACKAGE[n]).__version__ for n in names if n in PACKAGE}
    print(", ".join(f"{k} {v}" for k, v in versions.items()) + f"; load average {os.getloadavg()[0]:.2f}")

    import pyarrow.parquet as pq

    from model_store import load

    tune_process(1)
    pipeline = Pipeline(load(args.model))
    texts = pq.read_table(args.data, columns=["text"]).column("text").to_pylist()[: args.reviews]
    encoded = [pipeline.encode(s) for s in pipeline.segment(texts)]
    ngrams, cap = pipeline.saved.ngrams, pipeline.saved.segmenter.max_chars
    head = None if ngrams is None else ngrams.probabilities(t[:cap] for t in texts)
    scratch, args.work = args.work is None, args.work or Path(tempfile.mkdtemp(prefix="han-runtimes-"))
    args.work.mkdir(parents=True, exist_ok=True)
    write_reviews(args.work, texts, encoded)
    onnx = args.work / "han.onnx"
    chunks = length_sorted_chunks([len(ids) for ids, _ in encoded], pipeline.batch_size, pipeline.max_batch_tokens)
    print(f"{len(texts):,} reviews in {len(chunks)} batches of up to {pipeline.batch_size}")
    if any(name in PACKAGE for name in names):
        start = time.perf_counter()
        export(pipeline.model, feed([encoded[i] for i in chunks[len(chunks) // 2]]), onnx)
        print(f"exported {onnx} ({onnx.stat().st_size / 2**20:.1f} MiB) in {time.perf_counter() - start:.1f} s")

    reference = list(engine("project", pipeline, onnx, 1)(encoded))
    print("\nagreement with the project's forward (max abs difference; the issue asks <= 1e-4 and the same labels)")
    print(f"{'engine':<15}{'logits':>10}{'scores':>10}{'word w':>10}{'sent. w':>10}{'labels differ':>15}")
    for name in names[1:]:
        *worst, differ = agreement(pipeline, engine(name, pipeline, onnx, 1), reference, encoded, head)
        print(f"{name:<15}" + "".join(f"{x:>10.1e}" for x in worst) + f"{differ:>10} of {len(texts)}")
    del pipeline, reference  # the workers measure; this process only waits

    memory = {threads: measure(args, names, threads, len(texts)) for threads in args.threads}
    print("\nRSS increase of a worker process over the pipeline with the reviews loaded ('base'), MiB")
    print(f"{'engine':<15}{'threads':>8}{'base':>8}{'after load':>12}{'after a pass':>14}")
    for threads, readings in memory.items():
        for name, m in readings.items():
            print(f"{name:<15}{threads:>8}{m['base']:>8.0f}{m['loaded']:>+12.1f}{m['used']:>+14.1f}")
    if scratch:
        shutil.rmtree(args.work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
