"""A promotion and a rollback under load: 32 clients with explanations keep calling the service while
``han-model promote`` switches it to another version and ``han-model rollback`` switches it back.

    python benchmarks/promotion_load.py han-imdb:OLD han-imdb:NEW          # 32 clients, 70 s
    python benchmarks/promotion_load.py han-imdb:OLD han-imdb:NEW --clients 16 --seconds 40

Prints the errors and dropped connections (both must be 0), the responses that named no version, how
long after each command began the service answered with the new version (first and last response
of the old one), docs/s over the run, p50/p99 in the 10 s after each command against the 10 s before
the first, and each worker's memory (MiB, in ``worker_rss_mb_*``) before the promotion and after the
rollback once idle. The server follows the name's production pointer (``HAN_MODEL_TAG=NAME``) in the
model store of ``$BENTOML_HOME``; the pointer is put back as it was at the end (after a SIGTERM too).
The promotion is ``--force``d: this measures the switch, not the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.serve_load import DEFAULT_DATA, machine, summarize  # noqa: E402
from benchmarks.served import AUTH, Server, exit_on_signals  # noqa: E402
from han.environment import apply_defaults  # noqa: E402
from model_store import resolve_tag  # noqa: E402
from model_store.production import read_pointer, restore_pointer, split_tag  # noqa: E402

WINDOW = 10.0  # seconds after each command whose latencies are reported apart


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="the version in production at the start")
    parser.add_argument("new", help="the version promoted during the load (same name)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=70.0, help="length of the load (default 70)")
    parser.add_argument("--promote-at", type=float, default=20.0, help="seconds into the load (default 20)")
    parser.add_argument("--rollback-at", type=float, default=45.0, help="seconds into the load (default 45)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with IMDB test.parquet")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    return parser.parse_args(argv)


def han_model(*args: str) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "registry.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    return started, time.time(), done


async def load(url: str, texts: list[str], clients: int, seconds: float, answers: list, errors: list,
               dropped: list) -> None:
    """Closed-loop clients on keep-alive connections, each sending one review after another."""
    import aiohttp

    deadline = time.time() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def client(seed: int) -> None:
            rng = random.Random(seed)
            while time.time() < deadline:
                body = json.dumps({"documents": [rng.choice(texts)], "explain": True})
                sent = time.time()
                try:
                    async with session.post(url + "/classify", data=body,
                                            headers={"Content-Type": "application/json", **AUTH}) as response:
                        payload = await response.read()
                        if response.status != 200:
                            errors.append(f"HTTP {response.status}: {payload[:200]!r}")
                            continue
                        answers.append((sent, time.time(), json.loads(payload).get("model")))
                except (TimeoutError, aiohttp.ClientError) as e:  # a connection reset, closed or timed out
                    dropped.append(f"{type(e).__name__}: {e}")

        await asyncio.gather(*(client(i) for i in range(clients)))


def window(answers: list, start: float, end: float) -> dict:
    latencies = [done - sent for sent, done, _ in answers if start <= sent < end]
    figures = summarize(latencies, [], len(latencies), max(end - start, 1e-9), 0)
    return {k: figures[k] for k in ("documents", "p50_ms", "p99_ms", "max_ms")}


def switch(answers: list, command_start: float, moved: float, until: float, new: str, old: str) -> dict:
    """When the answers turned, from the command's start and from the pointer's move: the first answer
    of ``new``, and the last answer of ``old`` (before ``until``, the next command)."""
    after = [(done, model) for _, done, model in answers if command_start <= done < until]
    first_new = min((done for done, model in after if model == new), default=float("nan"))
    last_old = max((done for done, model in after if model == old), default=command_start)
    return {"pointer_moved_s": round(moved - command_start, 2),
            "first_new_s": round(first_new - command_start, 2), "last_old_s": round(last_old - command_start, 2),
            "first_new_after_move_s": round(first_new - moved, 2), "last_old_after_move_s": round(last_old - moved, 2)}


def pointer_moves(name: str) -> list[float]:
    """When each move of the pointer was written (its history, wall-clock seconds)."""
    from datetime import datetime

    return [datetime.fromisoformat(entry["at"]).timestamp() for entry in (read_pointer(name) or {})["history"]]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_signals()  # a SIGTERM too stops the server and puts the pointer back (the `finally` block)
    apply_defaults()
    import pyarrow.parquet as pq

    old, new = resolve_tag(args.old), resolve_tag(args.new)
    name = split_tag(old)[0]
    if split_tag(new)[0] != name:
        raise SystemExit("the two versions must be of one model name")
    texts = pq.read_table(args.data / "test.parquet", columns=["text"]).column("text").to_pylist()
    before = read_pointer(name)
    figures: dict = {"machine": machine(), "old": old, "new": new, "clients": args.clients}
    server = None
    operator: threading.Thread | None = None
    stopping = threading.Event()  # the load ended early (an error, a signal): the operator moves nothing more
    try:
        _, _, done = han_model("promote", old, "--force")
        if done.returncode:
            raise SystemExit(done.stderr)
        server = Server(name, None, "service.service:HANClassifier", {})
        server.wait_ready()
        asyncio.run(load(server.url, texts, 4, 5, [], [], []))  # warm-up
        rss_start = server.rss_mb()
        answers: list = []
        errors: list = []
        dropped: list = []
        commands: dict = {}

        def operate() -> None:
            t0 = time.time()
            if stopping.wait(args.promote_at):
                return
            commands["promote"] = han_model("promote", new, "--force")
            if stopping.wait(max(0.0, args.rollback_at - (time.time() - t0))):
                return
            commands["rollback"] = han_model("rollback", name)

        operator = threading.Thread(target=operate, daemon=True)
        started = time.time()
        operator.start()
        asyncio.run(load(server.url, texts, args.clients, args.seconds, answers, errors, dropped))
        elapsed = time.time() - started
        operator.join()
        time.sleep(3)  # idle: the workers give the released model's memory back
        rss_end = server.rss_mb()
        promote_start, _, promoted = commands["promote"]
        rollback_start, _, rolled = commands["rollback"]
        promote_moved, rollback_moved = pointer_moves(name)[-2:]
        figures.update({
            "commands": {k: {"exit": c[2].returncode, "seconds": round(c[1] - c[0], 2),
                             "output": (c[2].stdout + c[2].stderr).strip()} for k, c in commands.items()},
            "answers": len(answers), "errors": len(errors), "dropped_connections": len(dropped),
            "first_errors": (errors + dropped)[:3],
            "without_version": sum(model is None for *_, model in answers),
            "docs_per_s": round(len(answers) / elapsed, 1),
            "promotion": switch(answers, promote_start, promote_moved, rollback_start, new, old),
            "rollback": switch(answers, rollback_start, rollback_moved, float("inf"), old, new),
            "before": window(answers, promote_start - WINDOW, promote_start),
            "after_promote": window(answers, promote_start, promote_start + WINDOW),
            "after_rollback": window(answers, rollback_start, rollback_start + WINDOW),
            "whole_run": window(answers, started, started + elapsed),
            "worker_rss_mb_start": sorted(round(v, 1) for v in rss_start.values()),
            "worker_rss_mb_end": sorted(round(v, 1) for v in rss_end.values()),
            "load_average_after": os.getloadavg(),
        })
        if promoted.returncode or rolled.returncode:
            figures["failed"] = True
    finally:
        stopping.set()
        if operator is not None:
            operator.join()  # a promote or rollback under way ends before the pointer is put back
        if server is not None:
            server.stop()
        restore_pointer(before, name)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if figures.get("failed") or figures.get("errors") or figures.get("dropped_connections") else 0


if __name__ == "__main__":
    sys.exit(main())
