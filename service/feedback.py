"""``POST /feedback``: the true label of a document the service classified, when someone learns it.

The schema at ``/docs`` lists the served model's labels (``label`` for a single-label model,
``labels`` for a multi-label one), so a client generated from it knows them; the service reads the
labels as strings and checks each item against the version that answered its id, so that one bad
item never loses the others: the rest are stored durably (``monitoring.feedback_store``), and the
answer names what was refused (404: ids no answer has; 422: labels the answering version lacks).
"""

from __future__ import annotations

import json
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, create_model
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from monitoring.feedback_store import Feedback, FeedbackStore, RejectedError, StoreError
from service.api import DocumentId
from service.guard import replace_lone_surrogates
from service.way_back import model_facts

MAX_FEEDBACK = 1000  # items per request
MAX_FEEDBACK_BYTES = 1024 * 1024
ANSWER_GRACE = 0.3  # seconds an id no answer has yet is waited for (answers reach the store through queues)


class FeedbackResponse(BaseModel):
    stored: int = Field(description="How many documents' labels were stored (a later feedback for an id replaces "
                        "the earlier; an id given twice in a request keeps its last item).")
    unknown: list[str] = Field(default_factory=list, description="Ids no classified document has (a 404 lists them).")


def model_labels(directory: Path) -> tuple[list[str], bool] | None:
    """The labels of a model directory and whether it is multi-label, read from its JSON (no tensors)."""
    try:
        labels = json.loads((directory / "labels.json").read_text(encoding="utf-8"))
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        return [unicodedata.normalize("NFC", str(x)) for x in labels], bool(config["model"].get("multi_label"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def feedback_request(labels: list[str] | None, multi_label: bool) -> type[BaseModel]:
    """The request type of ``POST /feedback`` for a model with ``labels`` (any string where unknown)."""
    label: Any = Literal[tuple(labels)] if labels else Annotated[str, StringConstraints(strict=True, min_length=1)]
    if multi_label:
        field: Any = (list[label], Field(min_length=0, description="Every label that applies (none: an empty list)."))
        item = create_model("FeedbackItem", __config__=ConfigDict(extra="forbid"), labels=field,
                            id=(DocumentId, Field(description="The id /classify gave the document's result.")))
    else:
        item = create_model("FeedbackItem", __config__=ConfigDict(extra="forbid"),
                            id=(DocumentId, Field(description="The id /classify gave the document's result.")),
                            label=(label, Field(description="The document's true label.")))
    item.__doc__ = "The true label(s) of one classified document."
    request = create_model(
        "FeedbackRequest", __config__=ConfigDict(extra="forbid"),
        feedback=(list[item], Field(min_length=1, max_length=MAX_FEEDBACK,  # type: ignore[valid-type]
                                    description=f"1 to {MAX_FEEDBACK} items, each a document's id and its truth.")),
    )
    request.__doc__ = "The true labels of documents the service classified."
    return request


def truth(item: Any) -> list[str]:
    return list(item.labels) if hasattr(item, "labels") else [item.label]


def store_feedback(store: FeedbackStore, items: list[Any], source: str | None, flush: Callable[[float], bool],
                   served_labels: list[str] | None) -> tuple[FeedbackResponse, dict[str, tuple[str, list[str]]],
                                                             list[tuple[int, str]], dict[str, list[str]]]:
    """Store each item whose id was answered and whose labels are the answering version's (one transaction;
    an id given twice keeps its last item); returns what was stored with the ids no answer has, the answers
    found (id: model, labels), the items refused for their labels (index, why), and the stored labels that
    are new for their id (none before, or others: what /metrics counts, so a label sent again is not)."""
    ids = [item.id for item in items]
    # this worker's queued answers first: a reused id is found in the store, but its new answer may still
    # be queued, and the feedback judges the answer the client has just seen
    flushed = flush(ANSWER_GRACE)
    answered = store.latest_predictions(ids)
    deadline = time.monotonic() + ANSWER_GRACE
    while len(answered) < len(set(ids)) and time.monotonic() < deadline:  # an answer may be on its way to the
        flushed = flush(ANSWER_GRACE)  # store: this worker's queue, then another worker's or replica's
        time.sleep(0.05)
        answered.update(store.latest_predictions([i for i in ids if i not in answered]))
    unknown = list(dict.fromkeys(i for i in ids if i not in answered))
    if unknown and not flushed:  # answers of this worker still queued (the store was down): not unknown yet
        raise StoreError(f"the store is still catching up with this worker's answers ({unknown[0]!r} may be "
                         "among them); send the feedback again in a few seconds")
    refused, keep = [], []
    for k, item in enumerate(items):
        if item.id not in answered:
            continue
        facts = model_facts(answered[item.id][0])  # cached: a version's labels never change
        known = facts[1] if facts else served_labels
        if bad := [label for label in truth(item) if known is not None and label not in known]:
            refused.append((k, f"{bad[0]!r} is not a label of {answered[item.id][0]} (its labels: "
                               f"{', '.join(known or [])})"))
        else:
            keep.append(Feedback(item.id, truth(item)))
    # what is new is read in the transaction that stores it: the same feedback sent twice at once (a client's
    # retry through a load balancer) is new to one of the two requests, and counted once
    new = store.update_feedback(keep, source=source) if keep else {}
    return FeedbackResponse(stored=len({f.id for f in keep}), unknown=unknown), answered, refused, new


def unknown_message(unknown: list[str], stored: int) -> str:
    shown = ", ".join(repr(i) for i in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
    return (f"feedback: no classified document has the id(s) {shown} (ids come from /classify's results); "
            f"the other {stored} item(s) were stored")


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the request body"


def describe(error: dict[str, Any], labels: list[str] | None) -> str:
    """One readable line for a pydantic error about a FeedbackRequest."""
    where, kind, value = _where(tuple(error["loc"])), error["type"], error.get("input")
    if kind == "literal_error" and labels:
        return f"{where}: {value!r} is not a label of the model (its labels: {', '.join(labels)})"
    if kind == "missing":
        return f"{where}: this field is required"
    if kind == "extra_forbidden":
        return f"{where}: unknown field"
    if kind == "string_pattern_mismatch" and where.endswith(".id"):
        return f"{where}: an id cannot hold the NUL character (U+0000)"
    if kind == "json_invalid":
        return f"the request body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}"
    return f"{where}: {error['msg']}"


async def feedback_endpoint(request: Request, writer: Any, request_type: type[BaseModel],
                            labels: list[str] | None, counted: Any) -> Response:
    """``POST /feedback``: 200 with how many were stored; 404 naming unknown ids and 422 naming labels the
    answering model does not have (the other items are stored either way); 4xx naming any other problem
    of the request (nothing stored); 503 while the store cannot be reached."""
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FEEDBACK_BYTES:
                return JSONResponse({"error": f"the request body is larger than the limit of "
                                              f"{MAX_FEEDBACK_BYTES // 2**20} MB"}, status_code=413)
    except ClientDisconnect:  # gone before its body arrived: nothing stored, no one to answer
        return Response(status_code=400)
    if not body.strip():
        return JSONResponse({"error": 'the request body is empty; send {"feedback": [{"id": "...", '
                                      '"label": "..."}]}'}, status_code=400)
    try:
        parsed = request_type.model_validate_json(replace_lone_surrogates(bytes(body)))  # as /classify reads it
    except ValidationError as e:
        errors = e.errors(include_url=False)
        status = 400 if errors[0]["type"] == "json_invalid" else 422
        more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        return JSONResponse({"error": describe(errors[0], labels) + more}, status_code=status)
    items = parsed.feedback  # type: ignore[attr-defined]
    source = request.headers.get("x-feedback-source")
    try:
        store = await anyio.to_thread.run_sync(lambda: writer.store)
        answer, answered, refused, new = await anyio.to_thread.run_sync(
            store_feedback, store, items, source, writer.flush, labels)
    except RejectedError as e:  # an answer deleted meanwhile (retention): as unknown
        return JSONResponse({"error": f"feedback: {e}", "stored": 0, "unknown": e.unknown}, status_code=404)
    except StoreError as e:
        return JSONResponse({"error": f"feedback was not stored: {e}"}, status_code=503)
    counted({i: answered[i] for i in new}, new)
    if refused:
        k, why = refused[0]
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        return JSONResponse({"error": f"feedback[{k}]: {why}{more}; the other {answer.stored} item(s) were stored",
                             **answer.model_dump(), "refused": [k for k, _ in refused]}, status_code=422)
    if answer.unknown:
        return JSONResponse({"error": unknown_message(answer.unknown, answer.stored), **answer.model_dump()},
                            status_code=404)
    return JSONResponse(answer.model_dump())
