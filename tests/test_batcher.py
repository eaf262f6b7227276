"""The cross-request batcher (``service.batcher``): what it gathers, when it waits, what it keeps."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import itertools
import threading
import time
import weakref

import pytest

from service.batcher import RequestBatcher
from service.settings import Settings
from tests.asgi_calls import run_async


def test_batcher_runs_a_lone_request_at_once_and_gathers_the_ones_that_wait():
    batches: list[list[int]] = []

    def run(requests: list[int]) -> list[int]:
        batches.append(list(requests))
        time.sleep(0.05)  # the model is busy: requests arriving now wait for the next batch
        return [2 * r for r in requests]

    async def scenario() -> tuple[list[int], float]:
        batcher: RequestBatcher[int, int] = RequestBatcher(run)
        started = time.perf_counter()
        first = asyncio.create_task(batcher(0))
        await asyncio.sleep(0.01)
        rest = [asyncio.create_task(batcher(i)) for i in range(1, 10)]
        results = await asyncio.gather(first, *rest)
        return results, time.perf_counter() - started

    results, elapsed = run_async(scenario())
    assert results == [2 * i for i in range(10)]
    assert batches == [[0], list(range(1, 10))]
    assert elapsed < 0.5


def test_batcher_caps_a_batch_by_items_but_never_splits_a_request():
    batches: list[list[list[str]]] = []

    def run(requests: list[list[str]]) -> list[int]:
        batches.append(requests)
        time.sleep(0.02)
        return [len(r) for r in requests]

    async def scenario() -> list[int]:
        batcher: RequestBatcher[list[str], int] = RequestBatcher(run, size=len, max_items=4)
        blocker = asyncio.create_task(batcher(["x"]))
        await asyncio.sleep(0.005)
        waiting = [asyncio.create_task(batcher(["a"] * n)) for n in (2, 2, 3, 6, 1)]
        return await asyncio.gather(blocker, *waiting)

    assert run_async(scenario()) == [1, 2, 2, 3, 6, 1]
    sizes = [[len(r) for r in batch] for batch in batches]
    assert sizes == [[1], [2, 2], [3], [6], [1]]  # in arrival order; the 6-item request goes alone


def test_batcher_gives_each_caller_its_own_result_and_a_failed_batch_its_error():
    def run(requests: list[int]) -> list[int | str]:
        if -1 in requests:
            raise RuntimeError("the whole batch failed")
        return [f"bad {r}" if r % 2 else r for r in requests]  # a bad item is a value, as DocumentError is

    async def scenario() -> list[object]:
        batcher: RequestBatcher[int, int | str] = RequestBatcher(run)
        return await asyncio.gather(*(batcher(i) for i in (0, 1, 2, 3)))

    assert run_async(scenario()) == [0, "bad 1", 2, "bad 3"]

    async def failing() -> list[object]:
        batcher: RequestBatcher[int, int] = RequestBatcher(run)
        out = await asyncio.gather(batcher(-1), return_exceptions=True)
        return [*out, await batcher(4)]  # the batcher keeps working after a failed batch

    failed, after = run_async(failing())
    assert isinstance(failed, RuntimeError)
    assert after == 4


def test_batcher_drops_callers_that_went_away():
    seen: list[int] = []
    gate = threading.Event()

    def run(requests: list[int]) -> list[int]:
        seen.extend(requests)
        gate.wait(5)
        return requests

    async def scenario() -> int:
        batcher: RequestBatcher[int, int] = RequestBatcher(run)
        first = asyncio.create_task(batcher(1))
        await asyncio.sleep(0.02)
        gone = asyncio.create_task(batcher(2))
        kept = asyncio.create_task(batcher(3))
        await asyncio.sleep(0.02)
        gone.cancel()  # e.g. the client disconnected while waiting
        gate.set()
        await first
        return await kept

    assert run_async(scenario()) == 3
    assert seen == [1, 3]


def test_batcher_runs_on_idle_once_after_a_quiet_spell_never_between_close_requests():
    idle_calls: list[float] = []
    threads: list[str] = []

    def run(requests: list[int]) -> list[int]:
        threads.append(threading.current_thread().name)
        return requests

    def on_idle() -> None:
        idle_calls.append(time.perf_counter())
        threads.append(threading.current_thread().name)

    async def scenario() -> tuple[int, int, int]:
        batcher: RequestBatcher[int, int] = RequestBatcher(run, on_idle=on_idle, idle_seconds=0.5)
        loop_thread = threading.current_thread().name
        for i in range(5):  # requests 0.05 s apart: never idle for 0.5 s
            await batcher(i)
            await asyncio.sleep(0.05)
        during = len(idle_calls)
        await asyncio.sleep(1.0)  # quiet: the idle work runs, once
        after_quiet = len(idle_calls)
        await batcher(9)
        await asyncio.sleep(0.05)
        assert loop_thread not in threads  # the idle work runs in the worker thread, like a batch
        return during, after_quiet, len(idle_calls)

    assert run_async(scenario()) == (0, 1, 1)


def test_batcher_never_runs_a_batch_beside_the_idle_work_a_request_interrupts():
    """The idle work (a serving worker drops and rebuilds its caches) may take a while; a request
    that arrives meanwhile waits for it. Cancelling it instead would free the worker thread's slot
    while the work still ran, and the batch would run beside it (as a 500 showed under load)."""
    busy = threading.Event()
    overlaps: list[int] = []

    def run(requests: list[int]) -> list[int]:
        overlaps.append(busy.is_set())
        return requests

    def on_idle() -> None:
        busy.set()
        time.sleep(0.3)
        busy.clear()

    async def scenario() -> list[int]:
        batcher: RequestBatcher[int, int] = RequestBatcher(run, on_idle=on_idle, idle_seconds=0.2)
        await batcher(1)
        await asyncio.sleep(0.3)  # the idle work started 0.1 s ago and runs 0.2 s more
        assert busy.is_set()
        return [await batcher(2), await batcher(3)]

    assert run_async(scenario()) == [2, 3]
    assert overlaps == [False, False, False]


def test_batcher_keeps_nothing_of_a_finished_request_alive_at_rest():
    """The server's request (BentoML keeps it in a context variable, its body included) must not
    outlive its answer in the batcher's tasks or the idle worker thread: before, a 10 MB body
    stayed held until the next request (docs/experiments.md)."""
    request_var: contextvars.ContextVar[object] = contextvars.ContextVar("request")

    class Body:
        pass

    async def scenario() -> tuple[bool, list[int]]:
        batcher: RequestBatcher[list[int], int] = RequestBatcher(
            lambda requests: [sum(r) for r in requests], on_idle=lambda: None, idle_seconds=0.1)

        async def call() -> tuple[weakref.ref[Body], int]:
            body = Body()
            request_var.set(body)  # as the server does, in the request's own task
            return weakref.ref(body), await batcher(list(range(4)))

        ref, answer = await asyncio.create_task(call())
        await asyncio.sleep(0.5)  # the idle work has run in the worker thread
        gc.collect()
        return ref() is None, [answer]  # asked while the loop and its worker thread still live

    released, answers = run_async(scenario())
    assert answers == [6]
    assert released


def closed_loop(batcher: RequestBatcher[int, int], clients: int, requests: int):
    """``clients`` callers, each sending its next request as soon as it has its answer."""

    async def client(c: int) -> None:
        for _ in range(requests):
            await batcher(c)

    async def all_clients() -> None:
        first = asyncio.create_task(client(0))  # alone on an idle batcher: it runs at once
        await asyncio.sleep(0.005)
        await asyncio.gather(first, *(client(c) for c in range(1, clients)))

    return all_clients()


def test_batcher_waits_for_the_callers_it_answered_so_that_their_turns_merge():
    """Callers that send again on their answer settle, without the wait, into two groups that take
    turns (batches of 1 and 7 here); with it, every batch after the first holds all eight."""

    def sizes(wait: float) -> list[int]:
        batches: list[int] = []

        def run(requests: list[int]) -> list[int]:
            batches.append(len(requests))
            time.sleep(0.03)
            return requests

        run_async(closed_loop(RequestBatcher(run, wait=wait), clients=8, requests=6))
        return batches

    assert sizes(0) == [1, 7] * 6
    assert sizes(0.5) == [1, 8, 8, 8, 8, 8, 7]  # the first caller's last request went in the fifth


def test_batcher_never_holds_a_caller_that_is_back():
    """The wait ends as soon as the callers are back: one caller in a loop is never held."""

    def run(requests: list[int]) -> list[int]:
        time.sleep(0.3)
        return requests

    async def scenario() -> float:
        batcher: RequestBatcher[int, int] = RequestBatcher(run, wait=10.0)  # held up to 0.15 s a batch
        started = time.perf_counter()
        await closed_loop(batcher, clients=1, requests=4)
        return time.perf_counter() - started

    assert run_async(scenario()) < 4 * 0.3 + 0.25  # each of three waits would add 0.15 s


def test_batcher_waits_at_most_half_a_batch_for_callers_that_do_not_come_back():
    done: dict[int, float] = {}

    def run(requests: list[int]) -> list[int]:
        time.sleep(0.2)
        return requests

    async def scenario(wait: float) -> float:
        batcher: RequestBatcher[int, int] = RequestBatcher(run, wait=wait)
        started = time.perf_counter()
        first = asyncio.create_task(batcher(0))  # its caller sends nothing more
        await asyncio.sleep(0.05)
        second = await batcher(1)  # queued during the first batch: the wait is for 2, and 1 comes
        await first
        done[second] = time.perf_counter() - started
        return done[second]

    assert 0.38 < run_async(scenario(0)) < 0.48  # two batches back to back
    assert 0.49 < run_async(scenario(10.0)) < 0.65  # held half the first batch's 0.2 s
    assert 0.41 < run_async(scenario(0.02)) < 0.55  # or the setting's 20 ms


def test_the_batch_wait_setting_is_whole_milliseconds_or_a_clear_error():
    assert Settings.read({}).batch_wait == 0.010
    assert Settings.read({"HAN_BATCH_WAIT_MS": " 0 "}).batch_wait == 0
    assert Settings.read({"HAN_BATCH_WAIT_MS": "25"}).batch_wait == 0.025
    with pytest.raises(ValueError, match="HAN_BATCH_WAIT_MS must be a whole number of milliseconds.*'5ms'"):
        Settings.read({"HAN_BATCH_WAIT_MS": "5ms"})


def test_batcher_stops_waiting_for_callers_that_do_not_come_back():
    """Callers that each send once (every request a new caller, arriving while a batch runs): the
    first two waits find nobody back, and from then on a batch follows the last at once."""
    spans: list[tuple[float, float]] = []
    starts: list[float] = []

    def run(requests: list[int]) -> list[int]:
        started = time.perf_counter()
        starts.append(started)
        time.sleep(0.1)
        spans.append((started, time.perf_counter()))
        return requests

    async def scenario() -> None:
        batcher: RequestBatcher[int, int] = RequestBatcher(run, wait=10.0)  # held up to 0.05 s a batch
        calls = [asyncio.create_task(batcher(0))]
        for k in range(1, 8):
            while len(starts) < k:  # until batch k has started
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.03)  # inside batch k: the new caller is queued, not a returning one
            calls.append(asyncio.create_task(batcher(k)))
        await asyncio.gather(*calls)

    run_async(scenario())
    gaps = [later[0] - earlier[1] for earlier, later in itertools.pairwise(spans)]
    assert len(gaps) == 7
    assert min(gaps[:2]) > 0.04  # waited: the callers might have come back
    assert max(gaps[2:]) < 0.03, gaps  # no longer
