"""The request guard: a bad ``POST /classify`` gets a 4xx naming the problem before BentoML reads it.

Checks the size (the Content-Length header and the bytes actually received, so an over-long body
is never read whole), UTF-8, JSON syntax and the schema (every rule of it: the schema at ``/docs``
says exactly what is accepted), with messages such as ``documents[3]: the document is empty or
whitespace only`` or ``documents[2].id: must be a string, not a number``. A lone UTF-16 surrogate
escape (``"\\ud83d"``: JavaScript's ``JSON.stringify`` of a text cut inside an emoji) is replaced by
U+FFFD before the body is parsed (``replace_lone_surrogates``), so such a text is classified.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import anyio.to_thread
from pydantic import ValidationError
from starlette.responses import JSONResponse

from han.methods import METHODS
from han.pipeline import EMPTY_REASON
from service.api import MAX_BODY_BYTES, MAX_DOCUMENTS, MAX_ID_CHARS, VALIDATED, ClassifyRequest

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
THREAD_BYTES = 1 << 20  # a body over this is validated in a thread
# A run of escaped backslashes (text, never the start of an escape), a surrogate pair, or a lone surrogate.
_SURROGATE_ESCAPES = re.compile(
    rb"(?:\\\\)+|\\u[dD][89abAB][0-9a-fA-F]{2}(?:\\u[dD][c-fC-F][0-9a-fA-F]{2})?|\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _json_kind(value: Any) -> str:
    kinds = ((type(None), "null"), (bool, "a boolean"), ((int, float), "a number"), (str, "a string"),
             (list, "an array"), (dict, "an object"))
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


def _where(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _blank_reason(value: Any) -> str:
    """Why a text that does not match api.HAS_WORDS has no word, in the words han.Pipeline uses."""
    if isinstance(value, str) and value.strip():
        return EMPTY_REASON
    return "the document is empty or whitespace only"


def describe_error(error: dict[str, Any]) -> tuple[int, str]:
    """An HTTP status and a readable message for one pydantic error about a ClassifyRequest."""
    kind, loc, value = error["type"], tuple(error["loc"]), error.get("input")
    where = _where(loc)
    in_document = len(loc) >= 2 and loc[0] == "documents" and isinstance(loc[1], int)
    if kind == "json_invalid":
        return 400, f"the request body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}"
    if not loc and kind in ("model_type", "model_attributes_type", "dict_type"):
        return 422, f'the request body must be a JSON object like {{"documents": ["..."]}}, not {_json_kind(value)}'
    if kind == "missing":
        return 422, f"{where}: this field is required"
    if kind == "extra_forbidden":
        takes = '"id" and "text"' if in_document else '"documents" and "explain"'
        return 422, f"{where}: unknown field (it takes {takes})"
    if in_document and len(loc) == 2 and kind == "model_type":
        shape = 'a string or an object {"id": ..., "text": ...}'
        return 422, f"{where}: a document must be {shape}, not {_json_kind(value)}"
    if in_document and loc[2:] == ("id",) and kind == "string_pattern_mismatch":
        return 422, f"{where}: an id cannot hold the NUL character (U+0000)"
    if in_document and kind == "string_pattern_mismatch":
        return 422, f"{where}: {_blank_reason(value)}"
    if in_document and kind == "string_type":
        return 422, f"{where}: must be a string, not {_json_kind(value)}"
    if in_document and loc[2:] == ("id",) and kind in ("string_too_short", "string_too_long"):
        return 422, f"{where}: an id is 1 to {MAX_ID_CHARS} characters, not {len(value)}"
    if loc == ("documents",):
        if kind == "too_short":
            return 422, "documents: the list is empty; send at least one document"
        if kind == "too_long":  # a schema violation: 422 (413 is for a body over the byte limit)
            count = len(value) if isinstance(value, list) else "too many"
            return 422, f"documents: {count} documents is more than the limit of {MAX_DOCUMENTS} per request"
        if kind == "list_type":
            return 422, f"documents: must be a list of documents, not {_json_kind(value)}"
    if loc[:1] == ("explain",):
        wanted = f"true, false or a method name ({', '.join(METHODS)})"
        if isinstance(value, str):
            return 422, f"explain: unknown method {value!r}; it must be {wanted}"
        return 422, f"explain: must be {wanted}, not {_json_kind(value)}"
    return 422, f"{where or 'the request body'}: {error['msg']}"


def _keep_or_replace(match: re.Match[bytes]) -> bytes:
    escape = match.group()
    return escape if escape[1:2] == b"\\" or len(escape) == 12 else b"\\ufffd"


def replace_lone_surrogates(body: bytes) -> bytes:
    """``body`` with each lone surrogate escape (``\\ud83d`` not followed by a low one, or a low one
    alone) written as ``\\ufffd``. JSON allows them (a browser's ``JSON.stringify`` of a text cut inside
    an emoji writes one) but a Python str from them cannot be encoded, and pydantic refuses them; one
    code point for one keeps the result's offsets right in code points and in UTF-16 units alike."""
    if b"\\ud" not in body and b"\\uD" not in body:
        return body
    return _SURROGATE_ESCAPES.sub(_keep_or_replace, body)


def read_classify_body(body: bytes) -> tuple[bytes, ClassifyRequest | tuple[int, str]]:
    """The body as BentoML is to read it (lone surrogates replaced) and its request, or why it is not one."""
    body = replace_lone_surrogates(body)
    return body, validate_classify_body(body)


def validate_classify_body(body: bytes) -> ClassifyRequest | tuple[int, str]:
    """The /classify request in ``body``, or why it is not one (status, message)."""
    if not body.strip():
        return 400, 'the request body is empty; send a JSON object like {"documents": ["..."]}'
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        return 400, f"the request body is not valid UTF-8 (byte {e.start}: {e.reason})"
    try:
        return ClassifyRequest.model_validate_json(body)
    except ValidationError as e:
        errors = _one_per_field(e.errors(include_url=False))
        status, message = describe_error(errors[0])
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
        return status, message


class RequestGuard:
    """ASGI middleware: refuses a bad /classify request with a 4xx that names the problem.

    Checks the size (the Content-Length header and the bytes actually received, so an over-long
    body is never read whole), UTF-8, JSON syntax and the schema, then hands the body on to
    BentoML with the request it holds (``VALIDATED``): it is parsed once. Any media type but
    multipart and BentoML's pickle is read as JSON (``curl -d`` labels JSON as a form).
    """

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        path: str = "/classify",
        max_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.app = app
        self.path = path
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if media.startswith("multipart/") or media == "application/vnd.bentoml+pickle":
            message = f"the request body must be JSON (Content-Type: application/json), not {media}"
            await error_response(415, message)(scope, receive, send)
            return
        length = headers.get("content-length", "").strip()
        if length.isdigit() and int(length) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        if len(body) > THREAD_BYTES:  # megabytes of blanks take a while to check: not on the event loop
            data, request = await anyio.to_thread.run_sync(read_classify_body, bytes(body))
        else:
            data, request = read_classify_body(bytes(body))
        if isinstance(request, tuple):
            await error_response(*request)(scope, receive, send)
            return

        # The body is JSON whatever it was labelled (curl -d says form-urlencoded): tell BentoML so.
        scope = dict(scope)
        scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
        scope["headers"].append((b"content-type", b"application/json"))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        token = VALIDATED.set((data, request))
        try:
            await self.app(scope, replay, send)
        finally:
            VALIDATED.reset(token)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Read (and drop) what the client is still sending, up to a bound, before answering: a
        # server that answers and closes while the client is mid-upload resets the connection,
        # and most clients then lose the 413 itself.
        drained = 0
        while drained < 8 * self.max_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            drained += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        limit = f"{self.max_bytes / 2**20:g} MB" if self.max_bytes >= 2**20 else f"{self.max_bytes} bytes"
        await error_response(413, f"the request body is larger than the limit of {limit}")(scope, receive, send)


def _one_per_field(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One error per field, at the field's place. A union fails once per member: ``explain`` (a boolean
    or a method name) keeps its first; a document (a text or an object) keeps the member of its kind's
    errors, its location without the member's name (``documents[2].id``)."""
    kinds: dict[int, str] = {}  # a document's index -> the member its errors come from
    for error in errors:
        loc = error["loc"]
        if _member(loc) == "text" and error["type"] != "string_type":
            kinds[loc[1]] = "text"  # a string: its text's errors
        elif _member(loc) == "object" and kinds.get(loc[1]) != "text":
            kinds[loc[1]] = "object"  # an object's errors, or, for anything else, "not an object"
    seen, out = set(), []
    for error in errors:
        loc = tuple(error["loc"])
        member = _member(loc)
        if member is not None:
            if kinds[loc[1]] != member:
                continue
            error = {**error, "loc": loc[:2] + loc[3:]}
            loc = error["loc"]
        key = ("explain",) if loc[:1] == ("explain",) else loc
        if key not in seen:
            seen.add(key)
            out.append(error)
    return out


_MEMBERS = {"constrained-str": "text", "Document": "object"}  # pydantic's names of ClassifyRequest's members


def _member(loc: Sequence[Any]) -> str | None:
    """Which member of a document's union an error location is in (None: not a document's)."""
    if len(loc) >= 3 and loc[0] == "documents" and isinstance(loc[1], int):
        return _MEMBERS.get(loc[2])
    return None
