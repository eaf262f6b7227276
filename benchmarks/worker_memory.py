"""A serving worker's memory after hostile load (issue 31): what it holds at rest, and where.

Starts the service like ``serve_load.py`` (its own server on a free loopback port, ``han-bench`` with
``--make-bench-model``), then, reading every worker's RSS and ``/proc/<pid>/smaps`` at rest after each
phase (the worker gives freed heap back once idle 1 s; the reading waits ``--rest`` seconds):

1. plain load: 1,000 one-review requests with explanations from 32 clients;
2. the hostile suite: a 2,000-sentence document, a 100,000-word document, a 500,000-character word,
   and the largest request the API takes (256 documents filling the 10 MiB body) with every explanation
   method, each sent twice on new connections (so that both workers usually get one); the gradient-based
   methods run in a helper process beside each worker (service.gradients), whose RSS is shown while it runs;
3. a soak: ``--soak`` seconds at 50 clients of IMDB reviews, 5% of the requests 16 documents and 5%
   bad (an empty document, a number for a document: 422).

    python benchmarks/worker_memory.py --make-bench-model
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

from benchmarks.serve_load import DEFAULT_DATA, machine  # noqa: E402
from benchmarks.served import AUTH, Server, exit_on_signals  # noqa: E402
from han.environment import apply_defaults  # noqa: E402
from han.methods import METHODS  # noqa: E402
from service.api import MAX_BODY_BYTES, MAX_DOCUMENTS  # noqa: E402


def smaps(pid: int) -> dict[str, float]:
    """MiB of the worker's resident memory by kind: the malloc heap, other anonymous mappings (large
    allocations, thread stacks, torch's pools), and files (libraries, the mapped model)."""
    kinds = {"heap": 0, "anonymous": 0, "files": 0}
    name = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header
            name = fields[5] if len(fields) > 5 else ""
        elif fields[0] == "Rss:":
            kind = "heap" if name == "[heap]" else "anonymous" if not name or name.startswith("[") else "files"
            kinds[kind] += int(fields[1])
    return {k: round(v / 1024, 1) for k, v in kinds.items()}


def reading(server: Server, phase: str, rest: float) -> None:
    time.sleep(rest)
    sizes = server.rss_mb()
    rows = [(rss, smaps(pid)) for pid, rss in sizes.items()
            if b"_bentoml_impl.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    # the gradient-based explanations' helper processes (service.gradients), while any runs
    helpers = [rss for pid, rss in sizes.items() if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    print(f"{phase:<28}" + "   ".join(f"{rss:>6.0f} MiB (heap {k['heap']:.0f}, anon {k['anonymous']:.0f}, "
                                     f"files {k['files']:.0f})" for rss, k in rows)
          + (f"   gradient helpers {', '.join(f'{rss:.0f}' for rss in helpers)} MiB" if helpers else ""), flush=True)


async def post(session, url: str, body: dict) -> int:  # type: ignore[no-untyped-def]
    async with session.post(url + "/classify", data=json.dumps(body),
                            headers={"Content-Type": "application/json", **AUTH}) as response:
        await response.read()
        return response.status


async def send_all(url: str, bodies: list[dict], clients: int, seconds: float | None = None) -> dict[int, int]:
    """Send the bodies from ``clients`` connections (round and round for ``seconds`` when given)."""
    import aiohttp

    statuses: dict[int, int] = {}
    deadline = time.monotonic() + seconds if seconds else None
    position = 0
    connector = aiohttp.TCPConnector(limit=clients, force_close=True)  # new connections reach every worker
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def client() -> None:
            nonlocal position
            while True:
                if deadline is None and position >= len(bodies):
                    return
                if deadline is not None and time.monotonic() > deadline:
                    return
                body, position = bodies[position % len(bodies)], position + 1
                status = await post(session, url, body)
                statuses[status] = statuses.get(status, 0) + 1

        await asyncio.gather(*(client() for _ in range(clients)))
    return statuses


def hostile(copies: int) -> list[dict]:
    sentences = " ".join(f"Sentence {i} is about the film." for i in range(2000))
    words = " ".join(random.Random(0).choice(["good", "bad", "film", "plot", "actor"]) for _ in range(100_000))
    longest = ("A wonderful film, truly. " * 2000)[: (MAX_BODY_BYTES - 4096) // MAX_DOCUMENTS]
    bodies = [{"documents": [sentences]}, {"documents": [words]}, {"documents": ["x" * 500_000]}]
    bodies += [{"documents": [longest] * MAX_DOCUMENTS, "explain": method}
               for method in (*METHODS, False)]
    return [b for b in bodies for _ in range(copies)]


def soak_bodies(texts: list[str]) -> list[dict]:
    rng = random.Random(1)
    bodies: list[dict] = []
    for i, text in enumerate(texts):
        roll = rng.random()
        if roll < 0.05:
            bodies.append({"documents": texts[i : i + 16]})
        elif roll < 0.075:
            bodies.append({"documents": [""]})
        elif roll < 0.10:
            bodies.append({"documents": [text, 7]})
        else:
            bodies.append({"documents": [text]})
    return bodies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tag", nargs="?", default="han-imdb:latest", help="model tag (default han-imdb:latest)")
    parser.add_argument("--make-bench-model", action="store_true", help="register han-bench (if missing) and use it")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with IMDB test.parquet")
    parser.add_argument("--soak", type=float, default=120, help="seconds of the soak at 50 clients (default 120)")
    parser.add_argument("--rest", type=float, default=5, help="seconds at rest before each reading (default 5)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra server environment")
    args = parser.parse_args(argv)
    exit_on_signals()  # a SIGTERM too stops the server (the `finally` block)
    apply_defaults()
    tag = args.tag
    if args.make_bench_model:
        from benchmarks.bench_model import bench_model_dir, register_bench_model

        bench_model_dir(args.data / "train.parquet")
        tag = register_bench_model()
    import pandas as pd

    texts = pd.read_parquet(args.data / "test.parquet", columns=["text"])["text"].tolist()
    random.Random(0).shuffle(texts)
    info = machine()
    print(f"model {tag}; {info['cpus']} CPUs; load average {info['load_average_before']}")
    server = Server(tag, None, "service.service:HANClassifier", dict(e.split("=", 1) for e in args.env))
    try:
        server.wait_ready()
        print(f"{'worker RSS at rest':<28}one column per worker")
        reading(server, "started", args.rest)
        print("plain:", asyncio.run(send_all(server.url, [{"documents": [t]} for t in texts[:1000]], 32)))
        reading(server, "after a plain load", args.rest)
        started = time.monotonic()
        print("hostile:", asyncio.run(send_all(server.url, hostile(copies=2), 2)),
              f"{time.monotonic() - started:.0f} s")
        reading(server, "after the hostile suite", args.rest)
        print("soak:", asyncio.run(send_all(server.url, soak_bodies(texts[1000:]), 50, args.soak)))
        reading(server, f"after a {args.soak:.0f} s soak", args.rest)
        reading(server, "30 s later", 30)
        assert "Traceback" not in server.log_path.read_text(errors="replace"), f"see {server.log_path}"
    finally:
        server.stop()
    print(f"load average after: {machine()['load_average_before']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
