"""The HTTP service: classify documents and explain the predictions with a HAN from the model store.

``bentoml serve service.service:HANClassifier`` serves ``POST /classify``, ``GET /model``, the web
page at ``/``, ``/docs``, and BentoML's ``/livez``, ``/readyz`` and ``/metrics``; with API keys
configured, callers need one (``service.auth``). The model is ``$HAN_MODEL_TAG`` (default
``han-imdb:production``), declared as a ``BentoModel`` so that ``bentoml build`` bundles it; a
production pointer is followed while serving (``service.models``). Requests pass the guard
(``service.guard``), are gathered across requests (``service.batcher``) and classified by
``han.Pipeline``, the one inference path.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sys
from pathlib import Path
from uuid import uuid4

import bentoml
from pydantic import BaseModel
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

import han
from han.environment import apply_defaults, freeze_loaded_objects, release_free_memory, tune_process
from han.methods import ON_TORCH, explain_method
from model_store import DEFAULT_MODEL_TAG, ModelNotFoundError, model_path, model_tag_from_env, production_version
from model_store.production import follows_pointer, split_tag
from monitoring.shadow import ShadowRunner
from service.api import ClassifyRequest, ClassifyResponse, Document, ModelInfo
from service.auth import ApiKeyGuard, KeysError, bound_host, is_loopback, startup_keys
from service.batcher import RequestBatcher, observe_batch
from service.connections import SpreadConnections
from service.deadline import use_response_deadline
from service.feedback import feedback_endpoint, feedback_request, model_labels
from service.gradients import wait_for_stopped_helpers
from service.guard import RequestGuard, error_response
from service.metrics_dir import use_server_folder
from service.models import ModelFollower, Served, count_documents, load_served
from service.monitor_page import monitor_endpoint
from service.pages import make_pages
from service.plain_errors import JsonRefusals
from service.settings import Settings
from service.way_back import WayBack

use_server_folder(worker=bentoml.server_context.worker_index is not None)  # before any metric exists here

# (texts, explanation method or None, the model it runs on, the request's id, the documents' ids)
Request = tuple[list[str], str | None, Served, str, list[str]]


def served_model() -> tuple[str, str | None]:
    """The version to serve first, and the model name whose production pointer it follows (None: it
    stays). ``$HAN_MODEL_TAG``; else, in a built bento, the model it was built with; else
    ``han-imdb:production``."""
    ref = model_tag_from_env()
    src = Path(__file__).resolve().parent.parent  # <bento>/src/service/service.py in a bento
    bento_yaml = src.parent / "bento.yaml"
    if not ref and src.name == "src" and bento_yaml.is_file():
        import yaml

        info = yaml.safe_load(bento_yaml.read_text(encoding="utf-8")) or {}
        for service in info.get("services") or []:
            if service.get("name") == "HANClassifier" and service.get("models"):
                return str(service["models"][0]["tag"]), None
    ref = ref or DEFAULT_MODEL_TAG
    if not follows_pointer(ref):
        return ref, None
    name = split_tag(ref)[0]
    return production_version(name) or f"{name}:latest", name  # :latest only in a store with no version of it


try:
    SETTINGS = Settings.read()
except ValueError as e:
    sys.exit(f"error: {e}")
MODEL_TAG, FOLLOWS = served_model()
NAME = split_tag(MODEL_TAG)[0]  # the log, the feedback and the shadow are the name's, whichever version serves
try:
    LABELS, MULTI_LABEL = model_labels(model_path(MODEL_TAG)) or (None, False)
except ModelNotFoundError:  # BentoML's own loading reports it
    LABELS, MULTI_LABEL = None, False
FEEDBACK_READ = feedback_request(None, MULTI_LABEL)  # what is read: labels as strings, checked item by item
use_response_deadline()  # before BentoML builds a worker's app: no hook runs earlier


@functools.lru_cache(16)
def feedback_schema(tag: str) -> type[BaseModel]:
    """``POST /feedback``'s request type as /docs shows it: the labels of version ``tag``."""
    try:
        labels, multi_label = model_labels(model_path(tag)) or (LABELS, MULTI_LABEL)
    except ModelNotFoundError:
        labels, multi_label = LABELS, MULTI_LABEL
    return feedback_request(labels, multi_label)


@bentoml.service(
    name="HANClassifier",
    workers=SETTINGS.workers,
    traffic={"timeout": 120},
    http={"host": Settings.host, "port": 3000},
    # Request spans go nowhere without a trace exporter, and the access log costs as much CPU as a short
    # review: both off unless asked for (HAN_ACCESS_LOG=1; a deployment with an exporter drops the exclusion).
    logging={"access": {"enabled": SETTINGS.access_log}},
    tracing={"excluded_urls": [".*"]},
)
@bentoml.asgi_app(make_pages(lambda: HANClassifier, MODEL_TAG,
                             lambda: feedback_schema(bentoml.get_current_service().served.tag)), path="/")
class HANClassifier:
    """Document classification with a Hierarchical Attention Network, with explanations."""

    bento_model = bentoml.models.BentoModel(MODEL_TAG)

    @bentoml.on_deployment
    def check_deployment() -> None:  # type: ignore[misc]  # BentoML calls it without an instance
        """Once, in the serving process before any worker starts: stop in one line when the model's
        language has no tokenizer here, the keys are unreadable, or the service would be reachable
        from other machines without keys (unless anonymous access is asked for, with a warning)."""
        apply_defaults()  # offline, no telemetry: the workers inherit it
        # one malloc arena from a worker's start (han.environment.tune_process sets it too late for the threads
        # BentoML starts first): an arena per thread kept each burst's pages
        os.environ.setdefault("MALLOC_ARENA_MAX", "1")
        try:
            config = json.loads((model_path(MODEL_TAG) / "config.json").read_text(encoding="utf-8"))
            han.check_language(str((config.get("segmenter") or {}).get("language", "en")))
        except han.LanguageError as e:
            sys.exit(f"error: cannot serve {MODEL_TAG}: {e}")
        except (ModelNotFoundError, OSError, ValueError, AttributeError):
            pass  # BentoML's own loading reports a missing or broken model
        host = bound_host(sys.argv, SETTINGS)
        try:
            keys = startup_keys(host, SETTINGS)
        except KeysError as e:
            sys.exit(f"error: {e}")
        if not keys and not is_loopback(host):
            logging.getLogger("han.service").warning(
                "serving on %s without API keys: anyone who can reach it may call it", host)

    def __init__(self) -> None:
        tune_process()  # one inference thread, and malloc kept from returning each batch's tensors
        stored = self.bento_model
        served = load_served(str(stored.tag), Path(stored.path), stored.info.creation_time.isoformat())
        self.follower = ModelFollower(FOLLOWS, served, NAME)  # the one reference: a replaced version must be freed
        self.batcher: RequestBatcher[Request, list[han.DocumentResult] | han.DocumentError] = RequestBatcher(
            self._run_batch, size=lambda request: len(request[0]), on_batch=observe_batch,
            on_idle=self._rest, wait=SETTINGS.batch_wait,
        )
        self.way_back = WayBack(NAME, SETTINGS)  # the inference log, the feedback store, the monitor's gauges
        self.shadow = ShadowRunner(NAME, lambda tag: load_served(tag).pipeline, self._shadow_answered,
                                   self.batcher.busy, self.batcher.limiter)
        self.follower.shadow_status = self.shadow.status
        freeze_loaded_objects()  # the collector then walks only what requests allocate
        release_free_memory()  # loading's freed copies (the n-gram head's arrays among them): a worker starts
        # at the size it returns to at rest, not 10 MB above it

    @property
    def served(self) -> Served:
        """The version new requests go to."""
        return self.follower.current

    @property
    def info(self) -> ModelInfo:
        return self.served.info

    @bentoml.on_startup
    def _follow(self) -> None:
        """Follow the production pointer (a task of this worker's event loop, kept referenced)."""
        self._following = asyncio.get_running_loop().create_task(self.follower.run())  # pinned: reports only
        self._shadowing = asyncio.get_running_loop().create_task(self.shadow.run())
        self._helpers = asyncio.get_running_loop().create_task(self._stop_idle_helpers())

    async def _stop_idle_helpers(self) -> None:
        """The gradient-based explanations' helper (service.gradients) stops once unused for a while."""
        while True:
            await asyncio.sleep(1.0)
            self.served.gradients.stop_if_idle(SETTINGS.gradient_idle)

    @bentoml.on_shutdown
    def _stop_helpers(self) -> None:
        """The worker's report gone, the gradient helper stopped, every helper told to stop gone, and the
        store's queue written or kept."""
        if following := getattr(self, "_following", None):
            following.cancel()
        self.follower.forget()
        self.served.gradients.stop()
        wait_for_stopped_helpers()
        self.way_back.writer.close()  # what the store has not taken yet is kept for the next worker

    def _rest(self) -> None:
        """Once idle, a worker returns to its size at start: the pipeline's caches, then the freed heap."""
        self.served.pipeline.release_caches()
        release_free_memory()

    @bentoml.api(route="/classify", input_spec=ClassifyRequest, output_spec=ClassifyResponse)
    async def classify(
        self, documents: list[str | Document], explain: bool | str = True
    ) -> ClassifyResponse | JSONResponse:
        """Classify documents and, with `explain`, weigh each sentence and word by the chosen method.

        Results come back in input order, each with its document's id; documents from concurrent
        requests are batched together.
        """
        served = self.served  # the request finishes on this version, whatever is promoted meanwhile
        request_id = uuid4().hex  # random: unique across workers, processes and hosts
        texts = [d if isinstance(d, str) else d.text for d in documents]
        ids = [f"{request_id}-{i}" if isinstance(d, str) else d.id for i, d in enumerate(documents)]
        results = await self.batcher((texts, explain_method(explain), served, request_id, ids))
        if isinstance(results, han.DocumentError):  # only a text with no word within the model's caps
            i = results.index
            where = f"documents[{i}]" if isinstance(documents[i], str) else f"documents[{i}].text"
            return error_response(422, f"{where}: {results.reason}")
        count_documents(served.tag, len(results))
        self.shadow.offer(request_id, ids, texts)  # after the answer, if a shadow runs: never before it
        return ClassifyResponse.model_construct(request_id=request_id, results=results, model=served.tag)

    def _run_batch(self, requests: list[Request]) -> list[list[han.DocumentResult] | han.DocumentError]:
        """Classify the documents of several requests in as few pipeline calls as possible (one per model
        version and method). A request with a bad document gets its first one back (its index within it)."""
        out: list[list[han.DocumentResult] | han.DocumentError] = [[] for _ in requests]
        answers, profiles_of = [], {}
        for served, method in dict.fromkeys((s, m) for _, m, s, _, _ in requests):
            members = [r for r, (_, m, s, _, _) in enumerate(requests) if m == method and s is served]
            texts = [text for r in members for text in requests[r][0]]
            profiles: list[tuple[int, int]] = []
            if method in ON_TORCH:  # the gradient-based methods: torch, in a helper process (service.gradients)
                results = served.gradients(texts, method, "return", profiles)
            else:
                results = served.pipeline(texts, explain=method, errors="return", profiles=profiles)
            saved = served.pipeline.saved
            profiles_of[served.tag] = (saved.profile, bool(saved.config.multi_label))
            start = 0
            for r in members:
                end = start + len(requests[r][0])
                mine = results[start:end]
                error = next((x for x in mine if isinstance(x, han.DocumentError)), None)
                if error:
                    out[r] = han.DocumentError(error.index - start, error.reason)
                else:
                    _, _, _, request_id, ids = requests[r]
                    for result, document_id in zip(mine, ids, strict=True):
                        result.id = document_id  # type: ignore[union-attr]
                    out[r] = mine  # type: ignore[assignment]
                    answers.append((request_id, served.tag, "production", ids, requests[r][0], mine,
                                    profiles[start:end]))
                start = end
        self.way_back.record(answers, profiles_of)  # before any of these answers is sent
        return out

    def _shadow_answered(self, request_id: str, tag: str, ids: list[str], texts: list[str],
                         results: list[han.DocumentResult], profiles: list[tuple[int, int]]) -> None:
        self.way_back.record([(request_id, tag, "shadow", ids, texts, results, profiles)], {})

    async def feedback_api(self, request: HTTPRequest) -> Response:
        """``POST /feedback`` (routed by service.pages)."""
        return await feedback_endpoint(request, self.way_back.writer, FEEDBACK_READ, LABELS,
                                       self.way_back.feedback_counted)

    async def monitor_api(self, request: HTTPRequest) -> Response:
        """``GET /monitor`` (routed by service.pages)."""
        return await monitor_endpoint(request, NAME, SETTINGS.feedback_store, self.way_back.writer.default)


# The first added is the outermost: every response counts, a refused one too.
HANClassifier.add_asgi_middleware(SpreadConnections, requests=SETTINGS.requests_per_connection)
HANClassifier.add_asgi_middleware(ApiKeyGuard, settings=SETTINGS)
HANClassifier.add_asgi_middleware(RequestGuard)  # after the key check: a caller without a key is not read
HANClassifier.add_asgi_middleware(JsonRefusals)  # the router's plain 404 and 405 as {"error": ...}
