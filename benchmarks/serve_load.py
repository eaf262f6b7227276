"""Load test of the HTTP service on IMDB test reviews, with explanations.

Starts its own ``bentoml serve service.service:HANClassifier`` on a free loopback port, then:

* single client: one review per request, one request at a time -> latency p50 / p90 / p99;
* N concurrent clients (default 32), one review per request -> documents/s, errors, latency;
* (``--sweep``) the same at 2, 4, 8 and 16 clients: throughput against concurrency;
* the single client again, after the load.

Every request has ``"explain": true``. It also reports the server's CPU time per document, how many
requests the service gathered into each model call (from ``/metrics``) and the share of the clients'
connections the busiest worker held.

    python benchmarks/serve_load.py                        # serves han-imdb:latest
    python benchmarks/serve_load.py --make-bench-model     # registers and serves han-bench (see below)
    python benchmarks/serve_load.py --compare-keys         # API keys on against off, in turn (A B, B A, ...)
    python benchmarks/serve_load.py --compare-env HAN_LOG=0    # a setting against the defaults, in turn
    python benchmarks/serve_load.py --compare-shadow han-imdb:OTHER --fraction 0.2   # a shadow against none

``--make-bench-model`` registers ``han-bench``: the default architecture (``han.HANConfig`` and
``han.SegmenterConfig`` defaults), random weights and a vocabulary built from IMDB train
(min_freq 2, at most 50,000 entries). Speed does not depend on the weights, so it stands in for
the IMDB model before one is trained.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.served import AUTH, Server, exit_on_signals  # noqa: E402
from han.environment import apply_defaults  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "datasets" / "imdb"
REST_SECONDS = 2.0  # the worker RSS is read again this long after the load: a worker idle 1 s gives freed memory back



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tag", nargs="?", default=None, help="model tag (default han-imdb:latest, or han-bench)")
    parser.add_argument("--make-bench-model", action="store_true", help="register han-bench (if missing) and use it")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with IMDB train/test.parquet")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    parser.add_argument("--requests", type=int, default=3000, help="requests in the concurrent run (default 3000)")
    parser.add_argument("--single", type=int, default=400, help="requests in the single-client run (default 400)")
    parser.add_argument("--sweep", action="store_true", help="also measure 2, 4, 8 and 16 clients")
    parser.add_argument("--workers", type=int, default=None, help="service worker processes ($HAN_WORKERS)")
    parser.add_argument(
        "--service",
        default="service.service:HANClassifier",
        help="what to serve (benchmarks.adaptive_batching_service:HANClassifierAdaptive to compare)",
    )
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra server environment")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    parser.add_argument(
        "--compare-with",
        type=Path,
        metavar="CHECKOUT",
        help="instead: serve this other checkout (e.g. `git worktree add /tmp/prev HEAD~1`) and this one in "
        "turn, --rounds times, and print each one's docs/s under --clients clients and the ratio",
    )
    parser.add_argument("--compare-keys", action="store_true",
                        help="instead: serve this checkout without and with API keys in turn, --rounds times")
    parser.add_argument("--compare-env", metavar="NAME=VALUE", default=None,
                        help="instead: serve this checkout with NAME=VALUE against without it (the defaults), in turn")
    parser.add_argument("--compare-shadow", metavar="TAG", default=None,
                        help="instead: the service with TAG as a shadow (han-model shadow) against without one")
    parser.add_argument("--fraction", type=float, default=0.2, help="the shadow's share of documents (default 0.2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the comparison (default 3)")
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------------------------
# The clients
# ------------------------------------------------------------------------------------------------


async def run_load(url: str, texts: list[str], clients: int) -> dict:
    """Send one request per text from ``clients`` concurrent keep-alive connections."""
    import aiohttp

    queue = iter(texts)
    latencies: list[float] = []
    errors: list[str] = []
    documents = 0
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client() -> None:
            nonlocal documents
            for text in queue:
                body = json.dumps({"documents": [text], "explain": True})
                started = time.perf_counter()
                try:
                    async with session.post(
                        url + "/classify", data=body, headers={"Content-Type": "application/json", **AUTH}
                    ) as response:
                        payload = await response.read()
                        if response.status != 200:
                            errors.append(f"HTTP {response.status}: {payload[:200]!r}")
                            continue
                        # (answers before the way back, e.g. 3049f4c's, have no ids: a comparison runs them too)
                        if b'"results":[{' not in payload[:80] or b'"sentences":' not in payload:
                            errors.append(f"unexpected body: {payload[:200]!r}")
                            continue
                except (TimeoutError, aiohttp.ClientError) as e:
                    errors.append(f"{type(e).__name__}: {e}")
                    continue
                latencies.append(time.perf_counter() - started)
                documents += 1

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    return summarize(latencies, errors, documents, elapsed, clients)


def summarize(latencies: list[float], errors: list[str], documents: int, elapsed: float, clients: int) -> dict:
    ordered = sorted(latencies) or [float("nan")]

    def pct(q: float) -> float:
        return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {
        "clients": clients,
        "requests": documents + len(errors),
        "documents": documents,
        "errors": len(errors),
        "first_errors": errors[:3],
        "seconds": round(elapsed, 2),
        "docs_per_s": round(documents / elapsed, 1),
        "p50_ms": round(pct(0.50), 1),
        "p90_ms": round(pct(0.90), 1),
        "p99_ms": round(pct(0.99), 1),
        "max_ms": round(pct(1.0), 1),
        "mean_ms": round(1000 * statistics.fmean(ordered), 1) if latencies else None,
    }


def batch_counters(server: Server) -> tuple[float, float]:
    """(requests, model calls) so far: the service's own batcher, or BentoML's adaptive batching."""
    calls = server.metric("han_batch_requests_count")
    if calls:
        return server.metric("han_batch_requests_sum"), calls
    return (
        server.metric("bentoml_service_adaptive_batch_size_sum"),
        server.metric("bentoml_service_adaptive_batch_size_count"),
    )


def measured(server: Server, texts: list[str], clients: int) -> dict:
    """One run of the load, with the server's CPU time, its batching and, every second, the share of
    the connections the busiest worker held (0.5 of 32 with two workers: 16 each)."""
    cpu0, (req0, calls0) = server.cpu_seconds(), batch_counters(server)
    shares: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(1.0):
            counts = server.connections()
            if sum(counts):
                shares.append(max(counts) / sum(counts))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = asyncio.run(run_load(server.url, texts, clients))
    finally:
        done.set()
        sampler.join()
    result["busiest_worker_share"] = round(statistics.fmean(shares), 2) if shares else None
    cpu1, (req1, calls1) = server.cpu_seconds(), batch_counters(server)
    result["server_cpu_ms_per_doc"] = round(1000 * (cpu1 - cpu0) / max(1, result["documents"]), 2)
    result["requests_per_model_call"] = round((req1 - req0) / max(1, calls1 - calls0), 2)
    return result


def machine() -> dict:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "load_average_before": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_signals()  # a SIGTERM too stops the server (the `finally` blocks)
    apply_defaults()
    if args.make_bench_model:
        from benchmarks.bench_model import bench_model_dir, register_bench_model

        bench_model_dir(args.data / "train.parquet")
        tag = register_bench_model()
    else:
        tag = args.tag or os.environ.get("HAN_MODEL_TAG") or "han-imdb:latest"

    import pandas as pd

    texts = pd.read_parquet(args.data / "test.parquet", columns=["text"])["text"].tolist()
    random.Random(0).shuffle(texts)
    need = args.single + args.requests + 200
    texts = (texts * (need // len(texts) + 1))[:need]
    warmup, single, load = texts[:200], texts[200 : 200 + args.single], texts[200 + args.single :]
    info = machine()
    print(f"{args.service}, model {tag}")
    print(f"{info['cpus']} CPUs ({info['cpu_model']}); load average {info['load_average_before']}")
    print(f"IMDB test reviews: mean {statistics.fmean(map(len, load)):.0f} characters; explain=true\n", flush=True)

    extra_env = dict(item.split("=", 1) for item in args.env)
    if args.compare_with:
        versions = [("previous", args.compare_with.resolve(), extra_env), ("this", REPO, extra_env)]
        return compare(args, tag, versions, warmup, single, load)
    if args.compare_keys:
        keyed = {**extra_env, "HAN_API_KEYS": AUTH["Authorization"].removeprefix("Bearer ")}
        return compare(args, tag, [("keys off", REPO, extra_env), ("keys on", REPO, keyed)], warmup, single, load)
    if args.compare_shadow:
        from monitoring.shadow import read_shadow

        name = tag.partition(":")[0]
        if args.compare_shadow.partition(":")[0] != name:
            raise SystemExit(f"--compare-shadow {args.compare_shadow}: a service of {tag} shadows versions of "
                             f"{name} only")
        if existing := read_shadow(name):  # the comparison sets and ends the shadow of the name: not the user's
            raise SystemExit(f"{name} has a shadow already ({existing['tag']}, {existing.get('fraction', 0):.0%} "
                             f"of documents, since {existing.get('since')}): end it first (han-model shadow {name} "
                             "--stop), or compare on another model store ($BENTOML_HOME)")
        shadowed = f"shadow {args.fraction:g}"
        return compare(args, tag, [("no shadow", REPO, extra_env), (shadowed, REPO, extra_env)], warmup, single, load,
                       shadow={shadowed: (args.compare_shadow, args.fraction)})
    if args.compare_env:
        name, _, value = args.compare_env.partition("=")
        return compare(args, tag, [(args.compare_env, REPO, {**extra_env, name: value}), ("default", REPO, extra_env)],
                       warmup, single, load)
    server = Server(tag, args.workers, args.service, extra_env)
    results: dict = {"model": tag, "service": args.service, "env": extra_env, "machine": info, "runs": []}
    try:
        server.wait_ready()
        asyncio.run(run_load(server.url, warmup, 8))
        runs = [("single client", single, 1)]
        if args.sweep:
            runs += [(f"{c} clients", load[: max(200, 60 * c)], c) for c in (2, 4, 8, 16) if c < args.clients]
        runs.append((f"{args.clients} clients", load, args.clients))
        runs.append(("single, after", single, 1))  # does the load leave the service slower for one client?
        header = f"{'run':<15}{'docs':>6}{'errors':>8}{'docs/s':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}"
        header += f"{'cpu ms/doc':>12}{'req/batch':>11}{'busiest':>9}"
        print(header)
        for name, batch, clients in runs:
            result = measured(server, batch, clients)
            result["run"] = name
            results["runs"].append(result)
            print(
                f"{name:<15}{result['documents']:>6}{result['errors']:>8}{result['docs_per_s']:>9}"
                f"{result['p50_ms']:>9}{result['p90_ms']:>9}{result['p99_ms']:>9}"
                f"{result['server_cpu_ms_per_doc']:>12}{result['requests_per_model_call']:>11}"
                f"{result['busiest_worker_share'] or '':>9}",
                flush=True,
            )
            for error in result["first_errors"]:
                print(f"    error: {error}")
        results["worker_rss_mb"] = round(server.worker_rss_mb())
        time.sleep(REST_SECONDS)
        results["worker_rss_at_rest_mb"] = round(server.worker_rss_mb())
        print(f"\nlargest serving worker RSS after the runs: {results['worker_rss_mb']} MiB, "
              f"{REST_SECONDS:.0f} s later {results['worker_rss_at_rest_mb']} MiB")
    finally:
        server.stop()
    results["machine"]["load_average_after"] = os.getloadavg()
    print(f"\nload average after: {results['machine']['load_average_after']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _shadow_lines(tag: str) -> int:
    """Lines the shadow has written to the model's inference log so far."""
    from monitoring.log_files import log_folder, read_log

    return sum(1 for _ in read_log(log_folder(tag.partition(":")[0]), roles=["shadow"]))


def _settled_shadow_lines(tag: str, quiet: float = 2.0, timeout: float = 120.0) -> int:
    """``_shadow_lines`` once it has stopped growing for ``quiet`` seconds (at most ``timeout``): the shadow
    answers its copies in production's gaps, after the requests themselves."""
    lines, deadline = _shadow_lines(tag), time.monotonic() + timeout
    still_since = time.monotonic()
    while time.monotonic() - still_since < quiet and time.monotonic() < deadline:
        time.sleep(0.5)
        now = _shadow_lines(tag)
        if now != lines:
            lines, still_since = now, time.monotonic()
    return lines


def compare(args: argparse.Namespace, tag: str, versions: list[tuple[str, Path, dict[str, str]]],
            warmup: list[str], single: list[str], load: list[str],
            shadow: dict[str, tuple[str, float]] | None = None) -> int:
    """Two versions (checkouts, or settings), served in turn, the order swapped every round (A B, B A, ...):
    docs/s, latency and the server's CPU time a document per round, and the ratios of the second to the
    first. (A fixed order would put any drift between a round's two servers on one side.)"""
    figures: dict[str, list[dict]] = {name: [] for name, _, _ in versions}
    width = max(10, *(len(name) + 2 for name, _, _ in versions))
    header = (f"{'round':<7}{'version':<{width}}{'docs/s':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}"
              f"{'errors':>8}{'1-client p50':>14}")
    print(header + f"{'worker RSS MiB':>15}{'at rest':>9}{'cpu ms/doc':>12}{'busiest':>9}")
    from monitoring.shadow import start_shadow, stop_shadow

    for round_ in range(1, args.rounds + 1):
        for name, repo, env in versions if round_ % 2 else versions[::-1]:
            # Only a --compare-shadow run touches the shadow (main refused to start over one set already):
            # the one it starts for its shadowed version, ended after that version's server.
            server = None
            try:
                if name in (shadow or {}):
                    start_shadow(*shadow[name])  # read by each worker as it starts
                server = Server(tag, args.workers, args.service, env, repo=repo)
                server.wait_ready()
                asyncio.run(run_load(server.url, warmup, 8))
                if name in (shadow or {}):
                    # counted once the shadow has answered the warm-up's copies: the measured documents only
                    shadowed_before = _settled_shadow_lines(tag)
                one = measured(server, single, 1)
                many = measured(server, load, args.clients)
                rss = server.worker_rss_mb()
                time.sleep(REST_SECONDS)
                rest = server.worker_rss_mb()
            finally:
                if server is not None:
                    server.stop()
                if name in (shadow or {}):
                    stop_shadow(tag.partition(":")[0])
            if name in (shadow or {}):
                answered = _shadow_lines(tag) - shadowed_before
                print(f"    the shadow answered {answered} of the {len(single) + len(load)} documents sent (it is "
                      f"asked for {shadow[name][1]:.0%}; production first)", flush=True)
            figures[name].append(
                {
                    "docs_per_s": many["docs_per_s"],
                    "p50_ms": many["p50_ms"],
                    "p90_ms": many["p90_ms"],
                    "p99_ms": many["p99_ms"],
                    "max_ms": many["max_ms"],
                    "errors": many["errors"],
                    "single_p50_ms": one["p50_ms"],
                    "worker_rss_mb": round(rss),
                    "worker_rss_at_rest_mb": round(rest),
                    "server_cpu_ms_per_doc": many["server_cpu_ms_per_doc"],
                    "busiest_worker_share": many["busiest_worker_share"],
                }
            )
            print(
                f"{round_:<7}{name:<{width}}{many['docs_per_s']:>9}{many['p50_ms']:>9}{many['p90_ms']:>9}"
                f"{many['p99_ms']:>9}{many['max_ms']:>9}{many['errors']:>8}"
                f"{one['p50_ms']:>14}{round(rss):>15}{round(rest):>9}{many['server_cpu_ms_per_doc']:>12}"
                f"{many['busiest_worker_share'] or '':>9}",
                flush=True,
            )
            for error in one["first_errors"] + many["first_errors"]:
                print(f"    error: {error}", flush=True)
    (first, _, _), (second, _, _) = versions
    ratios = [t["docs_per_s"] / p["docs_per_s"] for p, t in zip(figures[first], figures[second], strict=True)]
    print(
        f"\n{second} / {first}, docs/s under {args.clients} clients, per round: "
        + ", ".join(f"{r:.3f}" for r in ratios)
        + f"; median {statistics.median(ratios):.3f}"
    )
    cpu = [t["server_cpu_ms_per_doc"] / p["server_cpu_ms_per_doc"] for p, t in zip(figures[first], figures[second],
                                                                                  strict=True)]
    p99 = [t["p99_ms"] / p["p99_ms"] for p, t in zip(figures[first], figures[second], strict=True)]
    print(f"{second} / {first}, p99 latency under {args.clients} clients, per round: "
          + ", ".join(f"{r:.3f}" for r in p99) + f"; median {statistics.median(p99):.3f}")
    print(f"{second} / {first}, the server's CPU time a document, per round: " + ", ".join(f"{r:.3f}" for r in cpu)
          + f"; median {statistics.median(cpu):.3f}")
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps({"model": tag, "figures": figures, "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
