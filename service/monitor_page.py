"""``GET /monitor``: the monitor's report (``han-model monitor``) as JSON, with each version's figures
over time, for the web page's charts. It reads the model store's log and the feedback store, in a
thread; the window is a span back from now (``?since=24h``; at most 30 days), of which the newest
MAX_RECORDS documents are reported: ``since`` is then the first of those (``asked_since`` the span's
start, ``cut`` true). One report at a time per worker (a report reads for seconds; more at once would
starve the worker's classifications): another request meanwhile gets 429. ``han-model monitor`` reads the
whole window, with no cap, outside the service."""

from __future__ import annotations

import contextlib
import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from monitoring.estimates import Window
from monitoring.feedback_store import StoreError, open_store
from monitoring.log_files import _first_time, log_files, log_folder, read_log
from monitoring.profiles import model_facts

SINCE_PATTERN = r"^[0-9]{1,4}[mhd]$"
MAX_RECORDS = 200_000  # the newest documents of the window that the page's report reads
MAX_SINCE = timedelta(days=30)
UNITS = {"m": "minutes", "h": "hours", "d": "days"}
RETRY_AFTER_S = 10
_busy = threading.Lock()  # one report at a time in this worker


def newest_start(folder: Path, start: datetime, keep: int) -> tuple[datetime, bool]:
    """Where to start reading so that the newest ``keep`` lines of the window are all read, and few more:
    the first time of the newest files that hold ``keep`` lines between them (counting newlines costs
    little next to parsing them); ``start`` when the window holds fewer. And whether a file left unread
    may hold documents of the window (the report is then cut)."""
    stamped = []
    for path in log_files(folder):
        with contextlib.suppress(OSError):
            if (first := _first_time(path)) is not None:
                stamped.append((first, path.stat().st_mtime, path))
    lines = 0
    stamped.sort(reverse=True)
    for i, (first, _, path) in enumerate(stamped):
        with contextlib.suppress(OSError), path.open("rb") as f:
            lines += sum(block.count(b"\n") for block in iter(lambda f=f: f.read(1 << 20), b""))
        if lines >= keep:
            with contextlib.suppress(ValueError):
                begin = datetime.fromisoformat(first + "+00:00")
                if begin > start:
                    return begin, any(mtime >= start.timestamp() for _, mtime, _ in stamped[i + 1:])
            return start, False
    return start, False


def monitor_report(name: str, store_url: str | None, default_store: Path, since: timedelta,
                   keep: int | None = None) -> dict[str, Any]:
    """The report, from a connection of its own (a long read never holds the worker's writes back), on at
    most ``keep`` of the window's newest documents, streamed: a few numbers a document are kept, never the
    records (``monitoring.estimates``)."""
    start, keep = datetime.now(UTC) - since, keep or MAX_RECORDS
    feedback: dict[tuple[str, str], list[str]] = {}
    if store_url or default_store.exists():
        with open_store(store_url, default_store) as store:  # each feedback with the answer it judged
            feedback = {(row.id, row.request_id): row.feedback for row in store.joined(since=start, labelled_only=True)
                        if row.feedback is not None}
    folder = log_folder(name)
    begin, older = newest_start(folder, start, keep)
    window = Window(feedback, model_facts, keep=keep).add_all(read_log(folder, begin, drop=("text", "text_sha256")))
    cut = window.cut or older
    first = window.first_time()
    asked = start.isoformat(timespec="seconds")
    report: dict[str, Any] = {
        "name": name, "since": first if cut and first else asked, "asked_since": asked, "first_document": first,
        "documents_read": window.kept, "cut": cut, "max_documents": keep, "versions": window.reports(with_series=True),
    }
    if cut:
        report["note"] = (f"cut to the window's newest {window.kept:,} documents, since {first}: older documents "
                          f"since {asked} were not read (han-model monitor reads the whole window)")
    return report


async def monitor_endpoint(request: Request, name: str, store_url: str | None, default_store: Path) -> Response:
    since = request.query_params.get("since", "24h")
    if not re.fullmatch(SINCE_PATTERN, since):
        return JSONResponse({"error": f"since: {since!r} is not a span like 30m, 24h or 7d"}, status_code=422)
    span = min(timedelta(**{UNITS[since[-1]]: int(since[:-1])}), MAX_SINCE)
    if not _busy.acquire(blocking=False):
        return JSONResponse({"error": "this worker is already computing a monitor report; try again in a few "
                                      "seconds"}, status_code=429, headers={"Retry-After": str(RETRY_AFTER_S)})
    try:
        return JSONResponse(await anyio.to_thread.run_sync(monitor_report, name, store_url, default_store, span))
    except StoreError as e:
        return JSONResponse({"error": f"the feedback store cannot be read: {e}"}, status_code=503)
    finally:
        _busy.release()
