"""The shadow's runner in a serving worker, without a server: the challenger's batches stay small whatever
the size of the copied request, since each batch holds production's model-call limiter."""

from __future__ import annotations

from monitoring.shadow import BATCH_DOCUMENTS, ShadowRunner


def test_a_large_copy_is_classified_in_batches_of_the_batch_size() -> None:
    runner = ShadowRunner("han-test", load=lambda tag: None, record=lambda *a: None, busy=lambda: False)
    runner.pipeline, runner.fraction = object(), 1.0  # a challenger loaded, shadowing every request
    runner.offer("r1", [f"a{i}" for i in range(5)], [f"text a{i}" for i in range(5)])
    runner.offer("r2", ["b0"], ["text b0"])
    runner.offer("r3", [f"c{i}" for i in range(256)], [f"text c{i}" for i in range(256)])
    batches = []
    while runner._queue:
        batches.append([(c.request_id, c.ids, c.texts) for c in runner._take()])
    assert all(sum(len(ids) for _, ids, _ in batch) <= BATCH_DOCUMENTS for batch in batches)
    assert [(r, i) for batch in batches for r, ids, _ in batch for i in ids] == (
        [("r1", f"a{i}") for i in range(5)] + [("r2", "b0")] + [("r3", f"c{i}") for i in range(256)])
    assert all(texts == [f"text {i}" for i in ids] for batch in batches for _, ids, texts in batch)  # each its own
    assert runner._queued == 0 and len(batches) == -(-262 // BATCH_DOCUMENTS)
