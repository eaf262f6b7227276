"""``GET /monitor``: the monitor's report (``han-model monitor``) as JSON, with each version's figures
over time, for the web page's charts. It reads the model store's log and the feedback store, in a
thread; the window is a span back from now (``?since=24h``; at most 30 days). ``han-model monitor`` reads
the whole window, with no cap, outside the service."""

from __future__ import annotations

import collections
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from monitoring.feedback_store import StoreError, open_store
from monitoring.log_files import log_folder, read_log
from monitoring.profiles import model_facts
from monitoring.report import report, series

SINCE_PATTERN = r"^[0-9]{1,4}[mhd]$"
MAX_RECORDS = 200_000  # the newest documents of the window that the page's report reads
MAX_SINCE = timedelta(days=30)
UNITS = {"m": "minutes", "h": "hours", "d": "days"}


def monitor_report(name: str, store_url: str | None, default_store: Path, since: timedelta) -> dict[str, Any]:
    """The report, from a connection of its own (a long read never holds the worker's writes back), on at
    most MAX_RECORDS of the window's newest records, without their texts (a worker's memory stays bounded)."""
    start = datetime.now(UTC) - since
    records: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_RECORDS)
    for record in read_log(log_folder(name), start):
        record.pop("text", None)
        records.append(record)
    feedback: dict[tuple[str, str], list[str]] = {}
    if store_url or default_store.exists():
        with open_store(store_url, default_store) as store:  # each feedback with the answer it judged
            feedback = {(row.id, row.request_id): row.feedback for row in store.joined(since=start, labelled_only=True)
                        if row.feedback is not None}
    models = {tag: facts for tag in dict.fromkeys(r["model"] for r in records) if (facts := model_facts(tag))}
    versions = report(records, feedback, models)
    for entry in versions:
        mine = [r for r in records if r["model"] == entry["model"] and r.get("role", "production") == entry["role"]]
        profile, labels, multi = models.get(entry["model"]) or (None, sorted(mine[0]["scores"]), False)
        entry["series"] = series(mine, feedback, profile, labels, multi)
    return {"name": name, "since": start.isoformat(timespec="seconds"), "documents_read": len(records),
            "versions": versions}


async def monitor_endpoint(request: Request, name: str, store_url: str | None, default_store: Path) -> Response:
    since = request.query_params.get("since", "24h")
    if not re.fullmatch(SINCE_PATTERN, since):
        return JSONResponse({"error": f"since: {since!r} is not a span like 30m, 24h or 7d"}, status_code=422)
    span = min(timedelta(**{UNITS[since[-1]]: int(since[:-1])}), MAX_SINCE)
    try:
        return JSONResponse(await anyio.to_thread.run_sync(monitor_report, name, store_url, default_store, span))
    except StoreError as e:
        return JSONResponse({"error": f"the feedback store cannot be read: {e}"}, status_code=503)
