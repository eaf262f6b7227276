"""The HTTP service: classify documents and explain the predictions with a HAN from the model store.

``bentoml serve service.service:HANClassifier`` serves:

* ``POST /classify``: ``{"documents": [...], "explain": true}`` -> labels, scores and, with
  ``explain``, every sentence's and word's attention weight with character offsets;
* ``GET /model``: the model's tag, labels, task, training date and metrics;
* ``GET /``: a web page that renders a document shaded by its attention; ``GET /docs``: the API;
* BentoML's ``/livez``, ``/readyz`` and ``/metrics``.

The model is ``$HAN_MODEL_TAG`` (default ``han-imdb:latest``) from the BentoML model store,
declared as a ``BentoModel`` so that ``bentoml build`` puts it in the bento. The one inference
path is ``han.Predictor``.

Batching: each worker process gathers the documents of concurrent requests into one call of
the predictor (``RequestBatcher``): a request that finds the model idle runs at once, and the
requests that arrive while a batch runs go together in the next one. Batches grow with the
load and an idle service adds no waiting time. (BentoML's own adaptive batching sits behind
an HTTP hop to a dependent service and, here, cost more CPU per document and latency than the
whole model call; see BENCHMARKS.md.)

Errors are JSON ``{"error": "..."}`` with a 4xx status that names the problem, e.g.
``documents[3]: the document is empty or whitespace only``; ``RequestGuard`` checks size,
media type, UTF-8, JSON and the schema before BentoML reads the body.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import os
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from json.encoder import encode_basestring_ascii as _esc  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import anyio
import bentoml
import torch
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route

import han
from han import InvalidDocumentError
from model_store import MODEL_TAG_ENV, default_model_tag


def served_model_tag() -> str:
    """The model to serve: ``$HAN_MODEL_TAG``; else, in a built bento, the model it was built with;
    else ``han-imdb:latest``. (A bento pins its model: a newer han-imdb in the store does not change it.)
    """
    if os.environ.get(MODEL_TAG_ENV):
        return default_model_tag()
    bento_yaml = Path(__file__).resolve().parent.parent.parent / "bento.yaml"  # <bento>/src/service/service.py
    if bento_yaml.is_file():
        import yaml

        info = yaml.safe_load(bento_yaml.read_text(encoding="utf-8")) or {}
        for service in info.get("services") or []:
            if service.get("name") == "HANClassifier" and service.get("models"):
                return str(service["models"][0]["tag"])
    return default_model_tag()


MODEL_TAG = served_model_tag()
MAX_DOCUMENTS = 256  # per request
MAX_BODY_BYTES = 10 * 1024 * 1024  # per request
MAX_BATCH_DOCUMENTS = 256  # documents per model call, gathered from concurrent requests
ROUND = 6  # decimals kept for scores and attention weights
WORKERS = int(os.environ.get("HAN_WORKERS", "2"))  # processes; each has its own model and batcher
STATIC = Path(__file__).resolve().parent / "static"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
T = TypeVar("T")
R = TypeVar("R")


# --------------------------------------------------------------------------------------------
# The API's types (they make the OpenAPI schema at /docs)
# --------------------------------------------------------------------------------------------


class ClassifyRequest(BaseModel):
    """Documents to classify, in the order the results should come back."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"example": {"documents": ["A moving, beautifully acted film."], "explain": True}},
    )

    documents: list[StrictStr] = Field(
        min_length=1,
        max_length=MAX_DOCUMENTS,
        description=f"1 to {MAX_DOCUMENTS} texts, each with at least one word. "
        "Text past the model's caps is cut (the result says truncated: true).",
    )
    explain: StrictBool = Field(
        default=True, description="Include the attention weight of every sentence and word (the sentences key)."
    )


class WordWeight(BaseModel):
    text: str = Field(description="The word exactly as in the document: document[start:end].")
    start: int = Field(description="Character offset of the word in the document (Python string index).")
    end: int
    weight: float = Field(description="Attention on the word within its sentence (a sentence's words sum to 1).")


class SentenceWeight(BaseModel):
    text: str = Field(description="The sentence exactly as in the document: document[start:end].")
    start: int
    end: int
    weight: float = Field(description="Attention on the sentence within the document (the sentences sum to 1).")
    words: list[WordWeight]


class DocumentResult(BaseModel):
    label: str = Field(description="The label with the highest score.")
    labels: list[str] = Field(
        description="Every label scored over the threshold (multi-label models), else the top label alone."
    )
    scores: dict[str, float] = Field(description="Every label's probability.")
    truncated: bool = Field(description="The document was longer than the model's caps and was cut.")
    sentences: list[SentenceWeight] = Field(
        default=None,  # type: ignore[assignment]  # the key is left out when explain is false
        description="The explanation, only when explain is true: the sentences and their words, with attention.",
    )


class ClassifyResponse(BaseModel):
    results: list[DocumentResult] = Field(description="One result per document, in input order.")


class ModelInfo(BaseModel):
    tag: str = Field(description="The model's tag in the BentoML model store.")
    labels: list[str]
    task: Literal["single-label", "multi-label"]
    threshold: float | None = Field(description="Decision threshold of a multi-label model; null for single-label.")
    trained_at: str | None = Field(description="When the model was trained (from its metadata), if recorded.")
    dataset: str | None = Field(
        description="What it was trained on (its metadata's dataset, else train_data), if recorded."
    )
    metrics: dict[str, Any] | None = Field(description="Evaluation metrics (from its metadata), if recorded.")
    metadata: dict[str, Any] = Field(description="Everything the training code recorded with the model.")
    registered_at: str = Field(description="When the model was saved into the model store.")
    architecture: dict[str, Any] = Field(description="The network's configuration (han.HANConfig).")
    limits: dict[str, int] = Field(description="Request limits and the model's document caps.")


class ErrorBody(BaseModel):
    error: str = Field(description="What is wrong with the request, e.g. 'documents[3]: the document is empty'.")


def render(prediction: han.DocumentResult) -> str:
    """A DocumentResult as compact JSON text.

    Written by hand rather than with ``json.dumps`` of dicts: this runs for every word of every
    document and is twice as fast. Strings go through the json module's ASCII escaper, so a lone
    surrogate sent in the input stays escaped. Weights and scores keep ``ROUND`` decimals.
    """
    parts = [
        '{"label":',
        _esc(prediction.label),
        ',"labels":[',
        ",".join(map(_esc, prediction.labels)),
        '],"scores":{',
        ",".join(f"{_esc(k)}:{round(v, ROUND)!r}" for k, v in prediction.scores.items()),
        '},"truncated":',
        "true" if prediction.truncated else "false",
    ]
    if prediction.sentences is not None:
        word = '{"text":%s,"start":%d,"end":%d,"weight":%r}'
        sentence = '{"text":%s,"start":%d,"end":%d,"weight":%r,"words":[%s]}'
        parts.append(',"sentences":[')
        parts.append(
            ",".join(
                sentence
                % (
                    _esc(s.text),
                    s.start,
                    s.end,
                    round(s.weight, ROUND),
                    ",".join([word % (_esc(w.text), w.start, w.end, round(w.weight, ROUND)) for w in s.words]),
                )
                for s in prediction.sentences
            )
        )
        parts.append("]")
    parts.append("}")
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# Batching across requests
# --------------------------------------------------------------------------------------------


class RequestBatcher(Generic[T, R]):
    """Gathers concurrent requests into one call of ``run`` (in a worker thread), in arrival order.

    ``run`` takes a list of requests and returns one result per request (a result may be an
    exception, which is raised to that request alone). A request that arrives while the model is
    idle is run at once; the ones that arrive during a batch are queued and run together next,
    up to ``max_items`` items (a larger request runs alone). ``on_batch(requests, items)`` is
    called for each batch (metrics).
    """

    def __init__(
        self,
        run: Callable[[list[T]], Sequence[R | BaseException]],
        size: Callable[[T], int] = lambda _: 1,
        max_items: int = MAX_BATCH_DOCUMENTS,
        on_batch: Callable[[int, int], None] | None = None,
    ) -> None:
        self.run = run
        self.size = size
        self.max_items = max_items
        self.on_batch = on_batch
        self._queue: collections.deque[tuple[T, asyncio.Future[R]]] = collections.deque()
        self._worker: asyncio.Task[None] | None = None
        self._limiter = anyio.CapacityLimiter(1)

    async def __call__(self, request: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch = [self._queue.popleft()]
            items = self.size(batch[0][0])
            while self._queue and items + self.size(self._queue[0][0]) <= self.max_items:
                request, future = self._queue.popleft()
                batch.append((request, future))
                items += self.size(request)
            batch = [(request, future) for request, future in batch if not future.done()]  # callers gone
            if not batch:
                continue
            if self.on_batch is not None:
                with contextlib.suppress(Exception):  # metrics must never stall the queue
                    self.on_batch(len(batch), sum(self.size(request) for request, _ in batch))
            try:
                results = await anyio.to_thread.run_sync(self.run, [r for r, _ in batch], limiter=self._limiter)
                if len(results) != len(batch):
                    raise RuntimeError(f"the batch function returned {len(results)} results for {len(batch)}")
            except Exception as e:
                results = [e] * len(batch)
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)


# --------------------------------------------------------------------------------------------
# Request checks, before BentoML reads the body
# --------------------------------------------------------------------------------------------


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _where(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe_error(error: dict[str, Any]) -> tuple[int, str]:
    """An HTTP status and a readable message for one pydantic error about a ClassifyRequest."""
    kind, loc, value = error["type"], tuple(error["loc"]), error.get("input")
    where = _where(loc)
    if kind == "json_invalid":
        return 400, f"the request body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}"
    if not loc and kind in ("model_type", "model_attributes_type", "dict_type"):
        return 422, f'the request body must be a JSON object like {{"documents": ["..."]}}, not {_json_kind(value)}'
    if kind == "missing":
        return 422, f"{where}: this field is required"
    if kind == "extra_forbidden":
        return 422, f'{where}: unknown field (the body takes "documents" and "explain")'
    if len(loc) == 2 and loc[0] == "documents" and kind == "string_type":
        return 422, f"{where}: the document must be a string, not {_json_kind(value)}"
    if loc == ("documents",):
        if kind == "too_short":
            return 422, "documents: the list is empty; send at least one document"
        if kind == "too_long":
            count = len(value) if isinstance(value, list) else "too many"
            return 413, f"documents: {count} documents is more than the limit of {MAX_DOCUMENTS} per request"
        if kind == "list_type":
            return 422, f"documents: must be a list of strings, not {_json_kind(value)}"
    if loc == ("explain",) and kind == "bool_type":
        return 422, f"explain: must be true or false, not {_json_kind(value)}"
    return 422, f"{where or 'the request body'}: {error['msg']}"


def check_classify_body(body: bytes) -> tuple[int, str] | None:
    """Why ``body`` is not an acceptable /classify request (status, message), or None if it is."""
    if not body.strip():
        return 400, 'the request body is empty; send a JSON object like {"documents": ["..."]}'
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        return 400, f"the request body is not valid UTF-8 (byte {e.start}: {e.reason})"
    try:
        ClassifyRequest.model_validate_json(body)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        status, message = describe_error(errors[0])
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
        return status, message
    return None


class RequestGuard:
    """ASGI middleware: refuses a bad /classify request with a 4xx that names the problem.

    Checks the size (the Content-Length header and the bytes actually received, so an over-long
    body is never read whole), UTF-8, JSON syntax and the schema, then replays the body to
    BentoML, which parses it again into the API's arguments. Any media type but multipart and
    BentoML's pickle is read as JSON (``curl -d`` labels JSON as a form).
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
        data = bytes(body)
        problem = check_classify_body(data)
        if problem is not None:
            await error_response(*problem)(scope, receive, send)
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

        await self.app(scope, replay, send)

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


# --------------------------------------------------------------------------------------------
# The web page, GET /model and the API documentation, mounted beside the API
# --------------------------------------------------------------------------------------------


async def index_page(_: Request) -> Response:
    return HTMLResponse((STATIC / "index.html").read_bytes())


async def model_info(_: Request) -> Response:
    return JSONResponse(bentoml.get_current_service().info.model_dump(mode="json"))


async def docs_page(_: Request) -> Response:
    import _bentoml_impl.server

    return FileResponse(Path(_bentoml_impl.server.__file__).parent / "main-openapi.html")


async def openapi_json(_: Request) -> Response:
    return JSONResponse(openapi_document())


@functools.cache
def openapi_document() -> dict[str, Any]:
    """BentoML's OpenAPI document for the service, plus the GET routes and error bodies it does not see."""
    spec = HANClassifier.openapi_spec.asdict()
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    ref = "#/components/schemas/{model}"
    for model in (ModelInfo, ErrorBody):
        schema = _openapi_30(model.model_json_schema(ref_template=ref))
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    spec["info"].update(
        title="HAN document classifier",
        version=str(MODEL_TAG),
        description="Classify documents with a Hierarchical Attention Network and see what it attended to: "
        "`POST /classify` gives each document's label, scores and (with `explain`) the attention weight of "
        "every sentence and word, with character offsets into the text. `GET /model` describes the model; "
        '`GET /` is a web page. Errors are JSON `{"error": "..."}` with a 4xx status.',
    )

    def error(description: str) -> dict[str, Any]:
        return {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": ref.format(model="ErrorBody")}}},
        }

    classify = spec["paths"]["/classify"]["post"]
    classify["summary"] = "Classify documents and explain the predictions"
    # BentoML keys responses by int: make them strings before adding ours (else "400" appears twice).
    classify["responses"] = {str(k): v for k, v in classify["responses"].items() if str(k) != "404"}
    classify["responses"].update(
        {
            "400": error("The body is empty, not UTF-8 or not JSON."),
            "413": error(f"The body is over {MAX_BODY_BYTES / 2**20:g} MB or has over {MAX_DOCUMENTS} documents."),
            "415": error("The body is multipart or pickle, not JSON."),
            "422": error("The JSON does not fit the schema, or a document is empty or has no words."),
        }
    )
    spec["paths"]["/model"] = {
        "get": {
            "summary": "The served model: tag, labels, task, training date and metrics",
            "operationId": "HANClassifier__model",
            "tags": ["Service APIs"],
            "responses": {
                "200": {
                    "description": "Successful Response",
                    "content": {"application/json": {"schema": {"$ref": ref.format(model="ModelInfo")}}},
                }
            },
        }
    }
    spec["paths"]["/"] = {
        "get": {
            "summary": "The web page: type a document, see its label and what the model attended to",
            "operationId": "HANClassifier__index",
            "tags": ["Service APIs"],
            "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}},
        }
    }
    return spec


def _openapi_30(schema: Any) -> Any:
    """Pydantic's JSON schema in OpenAPI 3.0 terms: ``anyOf [X, null]`` becomes ``X`` with ``nullable``."""
    if isinstance(schema, list):
        return [_openapi_30(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: _openapi_30(value) for key, value in schema.items()}
    options = schema.get("anyOf")
    if isinstance(options, list) and {"type": "null"} in options:
        rest = [option for option in options if option != {"type": "null"}]
        del schema["anyOf"]
        schema.update(rest[0] if len(rest) == 1 else {"anyOf": rest})
        schema["nullable"] = True
    return schema


pages = Starlette(
    routes=[
        Route("/", index_page, methods=["GET"]),
        Route("/model", model_info, methods=["GET"]),
        Route("/docs", docs_page, methods=["GET"]),
        Route("/docs.json", openapi_json, methods=["GET"]),
    ]
)


# --------------------------------------------------------------------------------------------
# The service
# --------------------------------------------------------------------------------------------


_batch_metrics: tuple[Any, Any] | None = None


def _observe_batch(requests: int, documents: int) -> None:
    """Record a batch in /metrics (created on first use: BentoML sets up multiprocess metrics first)."""
    global _batch_metrics
    if _batch_metrics is None:
        from prometheus_client import Histogram

        buckets = [1, 2, 4, 8, 16, 32, 64, 128, 256]
        _batch_metrics = (
            Histogram("han_batch_requests", "Requests gathered into one model call", buckets=buckets),
            Histogram("han_batch_documents", "Documents in one model call", buckets=buckets),
        )
    _batch_metrics[0].observe(requests)
    _batch_metrics[1].observe(documents)


@bentoml.service(
    name="HANClassifier",
    workers=WORKERS,
    traffic={"timeout": 120},
    http={"host": "127.0.0.1", "port": 3000},
)
@bentoml.asgi_app(pages, path="/")
class HANClassifier:
    """Document classification with a Hierarchical Attention Network, with attention explanations."""

    bento_model = bentoml.models.BentoModel(MODEL_TAG)

    def __init__(self) -> None:
        # One inference thread per worker process: more threads only fight over the cores.
        torch.set_num_threads(int(os.environ.get("HAN_TORCH_THREADS", "1")))
        stored = self.bento_model
        saved = han.SavedModel.load(stored.path)
        self.pipeline = han.Pipeline(saved)
        self.batcher: RequestBatcher[tuple[list[str], bool], list[str]] = RequestBatcher(
            self._run_batch, size=lambda request: len(request[0]), on_batch=_observe_batch
        )
        meta = saved.metadata
        config = saved.model.config
        self.info = ModelInfo(
            tag=str(stored.tag),
            labels=saved.labels,
            task="multi-label" if config.multi_label else "single-label",
            threshold=saved.threshold if config.multi_label else None,
            trained_at=None if meta.get("trained_at") is None else str(meta["trained_at"]),
            dataset=next((str(meta[key]) for key in ("dataset", "train_data") if meta.get(key) is not None), None),
            metrics=meta["metrics"] if isinstance(meta.get("metrics"), dict) else None,
            metadata=meta,
            registered_at=stored.info.creation_time.isoformat(),
            architecture=config.to_dict(),
            limits={
                "max_documents": MAX_DOCUMENTS,
                "max_body_bytes": MAX_BODY_BYTES,
                **{key: int(value) for key, value in saved.segmenter.to_dict().items()},
            },
        )

    @bentoml.api(route="/classify", input_spec=ClassifyRequest, output_spec=ClassifyResponse)
    async def classify(self, documents: list[str], explain: bool = True) -> ClassifyResponse:
        """Classify documents and, with `explain`, give each sentence's and word's attention weight.

        Results come back in input order; documents from concurrent requests are batched together.
        """
        try:
            parts = await self.batcher((documents, explain))
        except InvalidDocumentError as e:
            return error_response(422, f"documents[{e.index}]: {e.reason}")  # type: ignore[return-value]
        # The results are rendered JSON already (in the batch thread); splice them, don't re-encode.
        return Response('{"results":[' + ",".join(parts) + "]}", media_type="application/json")  # type: ignore[return-value]

    def _run_batch(self, requests: list[tuple[list[str], bool]]) -> list[list[str] | InvalidDocumentError]:
        """Classify the documents of several requests in as few pipeline calls as possible."""
        out: list[list[str] | InvalidDocumentError] = [[] for _ in requests]
        for explain in (True, False):
            members = [r for r, (_, e) in enumerate(requests) if e == explain]
            texts = [text for r in members for text in requests[r][0]]
            if not texts:
                continue
            results = self.pipeline(texts, explain="full" if explain else None, errors="return")
            i = 0
            for r in members:
                mine = results[i : i + len(requests[r][0])]
                i += len(mine)
                error = next((x for x in mine if isinstance(x, han.DocumentError)), None)
                if error is not None:
                    out[r] = InvalidDocumentError(error.index - (i - len(mine)), error.reason)
                else:
                    out[r] = [render(p) for p in mine]  # type: ignore[arg-type]
        return out


HANClassifier.add_asgi_middleware(RequestGuard)
