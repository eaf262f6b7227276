"""The service under open-loop traffic: requests arrive as a Poisson process at a set rate, whatever
the answers (``serve_load.py``'s clients each wait for their answer before sending again).

Serves this checkout once per setting in turn (the order swapped every round), each at every rate:
p50 / p90 / p99 latency and the server's CPU time a review. One IMDB test review a request, with its
explanation; a new connection whenever none is free.

    python benchmarks/open_loop.py --make-bench-model --rates 100,300,500 \\
        --setting HAN_BATCH_WAIT_MS=0 --setting HAN_BATCH_WAIT_MS=10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.serve_load import DEFAULT_DATA, machine, summarize  # noqa: E402
from benchmarks.served import AUTH, Server, exit_on_signals  # noqa: E402
from han.environment import apply_defaults  # noqa: E402


async def arrivals(url: str, texts: list[str], rate: float, seconds: float, seed: int) -> dict:
    """Send a request at each arrival of a Poisson process of ``rate`` a second for ``seconds``."""
    import aiohttp

    rng = random.Random(seed)
    latencies: list[float] = []
    errors: list[str] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(text: str) -> None:
            body = json.dumps({"documents": [text], "explain": True})
            started = time.perf_counter()
            async with session.post(url + "/classify", data=body,
                                    headers={"Content-Type": "application/json", **AUTH}) as response:
                await response.read()
                if response.status != 200:
                    errors.append(f"HTTP {response.status}")
                    return
            latencies.append(time.perf_counter() - started)

        tasks, start = [], time.perf_counter()
        due = start
        while due - start < seconds:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(one(texts[len(tasks) % len(texts)])))
            due += rng.expovariate(rate)
        await asyncio.gather(*tasks)
    return summarize(latencies, errors, len(latencies), time.perf_counter() - start,
                     clients=0)  # open loop: no fixed number of clients


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tag", nargs="?", default="han-imdb:latest", help="model tag (default han-imdb:latest)")
    parser.add_argument("--make-bench-model", action="store_true", help="register han-bench (if missing) and use it")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with IMDB test.parquet")
    parser.add_argument("--rates", default="100,300,500", help="requests a second, comma-separated")
    parser.add_argument("--seconds", type=float, default=15, help="seconds at each rate (default 15)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a server environment to compare (repeat; default: the defaults alone)")
    args = parser.parse_args(argv)
    exit_on_signals()  # a SIGTERM too stops the server (the `finally` block)
    apply_defaults()
    tag = args.tag
    if args.make_bench_model:
        from benchmarks.bench_model import register_bench_model

        tag = register_bench_model()
    import pyarrow.parquet as pq

    texts = pq.read_table(args.data / "test.parquet", columns=["text"]).column("text").to_pylist()
    random.Random(0).shuffle(texts)
    settings = args.setting or ["defaults"]
    print(f"model {tag}; load average {machine()['load_average_before']}", flush=True)
    for round_ in range(args.rounds):
        for setting in settings if round_ % 2 == 0 else settings[::-1]:
            env = dict([setting.split("=", 1)]) if "=" in setting else {}
            server = Server(tag, None, "service.service:HANClassifier", env)
            try:
                server.wait_ready()
                asyncio.run(arrivals(server.url, texts[:200], 50, 3, seed=99))  # warm-up
                for rate in (float(r) for r in args.rates.split(",")):
                    cpu = server.cpu_seconds()
                    got = asyncio.run(arrivals(server.url, texts, rate, args.seconds, seed=round_))
                    cpu_ms = 1000 * (server.cpu_seconds() - cpu) / max(1, got["documents"])
                    print(f"round {round_ + 1}  {setting:<24} {rate:>6.0f}/s  answered {got['documents']:>6}  "
                          f"errors {got['errors']}  p50 {got['p50_ms']:>6}  p90 {got['p90_ms']:>6}  "
                          f"p99 {got['p99_ms']:>6} ms  server CPU {cpu_ms:.2f} ms a review", flush=True)
            finally:
                server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
