"""``POST /feedback``: the true label of a document the service classified, when someone learns it.

The request schema is built from the served model's labels, so a client generated from ``/docs.json``
knows them (``label`` for a single-label model, ``labels`` for a multi-label one). Feedback for ids
the store knows is written durably (``monitoring.feedback_store``); the rest of the request is never
lost for an unknown id: the known items are stored, and the answer is a 404 naming the unknown ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, create_model
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from monitoring.feedback_store import Feedback, FeedbackStore, RejectedError, StoreError
from service.api import MAX_ID_CHARS

MAX_FEEDBACK = 1000  # items per request
MAX_FEEDBACK_BYTES = 1024 * 1024
DocumentId = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_ID_CHARS)]


class FeedbackResponse(BaseModel):
    stored: int = Field(description="How many items were stored (a later feedback for an id replaces the earlier).")
    unknown: list[str] = Field(default_factory=list, description="Ids no classified document has (a 404 lists them).")


def model_labels(directory: Path) -> tuple[list[str], bool] | None:
    """The labels of a model directory and whether it is multi-label, read from its JSON (no tensors)."""
    try:
        labels = json.loads((directory / "labels.json").read_text(encoding="utf-8"))
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        return [str(x) for x in labels], bool(config["model"].get("multi_label"))
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


def store_feedback(store: FeedbackStore, items: list[Any], source: str | None) -> FeedbackResponse:
    """Store the items whose ids the store knows (one transaction); name the others."""
    feedback = [Feedback(item.id, list(item.labels) if hasattr(item, "labels") else [item.label]) for item in items]
    unknown = store.unknown([f.id for f in feedback])
    missing = set(unknown)
    known = [f for f in feedback if f.id not in missing]
    stored = store.add_feedback(known, source=source) if known else 0
    return FeedbackResponse(stored=stored, unknown=unknown)


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
    if kind == "json_invalid":
        return f"the request body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}"
    return f"{where}: {error['msg']}"


async def feedback_endpoint(request: Request, store: FeedbackStore, request_type: type[BaseModel],
                            labels: list[str] | None, counted: Any) -> Response:
    """``POST /feedback``: 200 with how many were stored; 404 naming unknown ids (the others are stored);
    4xx naming any other problem, with nothing stored."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FEEDBACK_BYTES:
            return JSONResponse({"error": f"the request body is larger than the limit of "
                                          f"{MAX_FEEDBACK_BYTES // 2**20} MB"}, status_code=413)
    if not body.strip():
        return JSONResponse({"error": 'the request body is empty; send {"feedback": [{"id": "...", '
                                      '"label": "..."}]}'}, status_code=400)
    try:
        parsed = request_type.model_validate_json(bytes(body))
    except ValidationError as e:
        errors = e.errors(include_url=False)
        status = 400 if errors[0]["type"] == "json_invalid" else 422
        more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        return JSONResponse({"error": describe(errors[0], labels) + more}, status_code=status)
    items = parsed.feedback  # type: ignore[attr-defined]
    source = request.headers.get("x-feedback-source")
    try:
        answer = await anyio.to_thread.run_sync(store_feedback, store, items, source)
        answered = await anyio.to_thread.run_sync(store.latest_predictions, [i.id for i in items])
    except RejectedError as e:  # an id classified meanwhile by nobody: as unknown
        return JSONResponse({"error": f"feedback: {e}", "stored": 0, "unknown": e.unknown}, status_code=404)
    except StoreError as e:
        return JSONResponse({"error": f"feedback was not stored: {e}"}, status_code=503)
    truths = {f.id: list(f.labels) if hasattr(f, "labels") else [f.label] for f in items}
    counted({k: v for k, v in answered.items() if k not in set(answer.unknown)}, truths)
    if answer.unknown:
        return JSONResponse({"error": unknown_message(answer.unknown, answer.stored), **answer.model_dump()},
                            status_code=404)
    return JSONResponse(answer.model_dump())
