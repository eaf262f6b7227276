"""The HTTP service: classify documents and explain the predictions with a HAN from the model store.

``bentoml serve service.service:HANClassifier`` serves ``POST /classify`` (labels, calibrated scores
and, with ``explain``, every sentence's and word's weight with character offsets), ``GET /model``,
the web page at ``/``, ``/docs``, and BentoML's ``/livez``, ``/readyz`` and ``/metrics``; with API
keys configured, callers need one (``service.auth``).

The model is ``$HAN_MODEL_TAG`` (default ``han-imdb:production``), declared as a ``BentoModel`` so
that ``bentoml build`` puts it in the bento. ``NAME`` or ``NAME:production`` follows the production
pointer while serving (``service.models``); a version, ``NAME:latest`` or a bento's own model is
served as it is. Requests pass the guard (``service.guard``), are gathered across requests
(``service.batcher``) and classified by ``han.Pipeline``, the one inference path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import bentoml
from starlette.responses import JSONResponse

import han
from han.environment import apply_defaults, freeze_loaded_objects, release_free_memory, tune_process
from model_store import MODEL_TAG_ENV, ModelNotFoundError, default_model_tag, model_path
from model_store.production import follows_pointer, production_tag, split_tag
from service.api import ClassifyRequest, ClassifyResponse, ModelInfo, explain_method
from service.auth import (
    ANONYMOUS_ENV,
    KEYS_FILE_ENV,
    METRICS_OPEN_ENV,
    ApiKeyGuard,
    KeysError,
    bound_host,
    is_loopback,
    startup_keys,
)
from service.batcher import RequestBatcher, batch_wait, observe_batch
from service.connections import SpreadConnections, requests_per_connection
from service.deadline import use_response_deadline
from service.guard import RequestGuard, error_response
from service.models import ModelFollower, Served, count_documents, load_served
from service.pages import make_pages
from service.settings import whole_number

apply_defaults()
Request = tuple[list[str], str | None, Served]  # (documents, explanation method or None, the model it runs on)
# BentoML logs every request and opens a tracing span for it; with no trace exporter configured the
# spans go nowhere. The two cost about 0.5 ms of CPU a request, as much as classifying a short
# review (BENCHMARKS.md). HAN_ACCESS_LOG=1 turns the log back on; a deployment with a trace exporter
# removes the exclusion.
OBSERVABILITY: dict[str, Any] = {"logging": {"access": {"enabled": os.environ.get("HAN_ACCESS_LOG") == "1"}},
                                 "tracing": {"excluded_urls": [".*"]}}


def served_model() -> tuple[str, str | None]:
    """The version to serve first, and the model name whose production pointer it follows (None: it
    stays). ``$HAN_MODEL_TAG``; else, in a built bento, the model it was built with (a bento pins its
    model); else ``han-imdb:production``."""
    ref = os.environ.get(MODEL_TAG_ENV, "").strip()
    src = Path(__file__).resolve().parent.parent  # <bento>/src/service/service.py in a bento
    bento_yaml = src.parent / "bento.yaml"
    if not ref and src.name == "src" and bento_yaml.is_file():
        import yaml

        info = yaml.safe_load(bento_yaml.read_text(encoding="utf-8")) or {}
        for service in info.get("services") or []:
            if service.get("name") == "HANClassifier" and service.get("models"):
                return str(service["models"][0]["tag"]), None
    ref = ref or default_model_tag()
    if not follows_pointer(ref):
        return ref, None
    name = split_tag(ref)[0]
    return production_tag(name) or f"{name}:latest", name


def refuse_unservable_language(tag: str) -> None:
    """Stop in one line, before any worker starts, when the model's language needs a tokenizer package
    that is not installed here (a missing or broken model is reported by BentoML's own loading)."""
    try:
        segmenter = json.loads((model_path(tag) / "config.json").read_text(encoding="utf-8")).get("segmenter") or {}
        han.check_language(str(segmenter.get("language", "en")))
    except han.LanguageError as e:
        sys.exit(f"error: cannot serve {tag}: {e}")
    except (ModelNotFoundError, OSError, ValueError, AttributeError):
        return


def api_keys() -> list[bytes]:
    """The API keys; stops in one line when the keys are unreadable, or when the service would be
    reachable from other machines with none (unless anonymous access is asked for, with a warning)."""
    host, anonymous = bound_host(sys.argv, os.environ), os.environ.get(ANONYMOUS_ENV) == "1"
    try:
        keys = startup_keys(host, anonymous)
    except KeysError as e:
        sys.exit(f"error: {e}")
    if anonymous and not keys and not is_loopback(host):
        logging.getLogger(__name__).warning("serving on %s without API keys: anyone who can reach it may call it",
                                            host)
    return keys


use_response_deadline()  # before BentoML builds a worker's app
MODEL_TAG, FOLLOWS = served_model()
refuse_unservable_language(MODEL_TAG)
API_KEYS = api_keys()
try:
    # processes, each with its own model and batcher
    WORKERS = whole_number(os.environ, "HAN_WORKERS", 2, "processes", "at least 1", minimum=1)
    REQUESTS_PER_CONNECTION, BATCH_WAIT = requests_per_connection(), batch_wait()
except ValueError as e:
    sys.exit(f"error: {e}")


@bentoml.service(
    name="HANClassifier",
    workers=WORKERS,
    traffic={"timeout": 120},
    http={"host": "127.0.0.1", "port": 3000},
    **OBSERVABILITY,
)
@bentoml.asgi_app(make_pages(lambda: HANClassifier, MODEL_TAG), path="/")
class HANClassifier:
    """Document classification with a Hierarchical Attention Network, with explanations."""

    bento_model = bentoml.models.BentoModel(MODEL_TAG)

    def __init__(self) -> None:
        # One inference thread per worker process (more only fight over the cores), and malloc
        # kept from handing every batch's tensors back to the kernel (han.environment.tune_process).
        tune_process()
        stored = self.bento_model
        served = load_served(str(stored.tag), Path(stored.path), stored.info.creation_time.isoformat())
        self.follower = ModelFollower(FOLLOWS, served)  # the one reference: a replaced version must be freed
        self.batcher: RequestBatcher[Request, list[han.DocumentResult] | han.DocumentError] = RequestBatcher(
            self._run_batch, size=lambda request: len(request[0]), on_batch=observe_batch,
            on_idle=self._rest, wait=BATCH_WAIT,
        )
        freeze_loaded_objects()  # the collector then walks only what requests allocate

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
        if self.follower.name is not None:
            self._following = asyncio.get_running_loop().create_task(self.follower.run())

    def _rest(self) -> None:
        """Once idle, a worker returns to its size at start: the pipeline's caches, then the freed
        heap, go back (70-80 ms measured in process, in the inference thread; a request that arrives
        meanwhile waits for it, and the first documents after it segment about 1 ms slower)."""
        self.served.pipeline.release_caches()
        release_free_memory()

    @bentoml.api(route="/classify", input_spec=ClassifyRequest, output_spec=ClassifyResponse)
    async def classify(self, documents: list[str], explain: bool | str = True) -> ClassifyResponse | JSONResponse:
        """Classify documents and, with `explain`, weigh each sentence and word by the chosen method.

        Results come back in input order; documents from concurrent requests are batched together.
        """
        served = self.served  # the request finishes on this version, whatever is promoted meanwhile
        results = await self.batcher((documents, explain_method(explain), served))
        if isinstance(results, han.DocumentError):
            return error_response(422, f"documents[{results.index}]: {results.reason}")
        count_documents(served.tag, len(results))
        return ClassifyResponse.model_construct(results=results, model=served.tag)

    def _run_batch(self, requests: list[Request]) -> list[list[han.DocumentResult] | han.DocumentError]:
        """Classify the documents of several requests in as few pipeline calls as possible (one per model
        version and method). A request with a bad document gets its first one back (its index within it)."""
        out: list[list[han.DocumentResult] | han.DocumentError] = [[] for _ in requests]
        for served, method in dict.fromkeys((s, m) for _, m, s in requests):
            members = [r for r, (_, m, s) in enumerate(requests) if m == method and s is served]
            texts = [text for r in members for text in requests[r][0]]
            results = served.pipeline(texts, explain="full" if method else None, method=method or "attention",
                                      errors="return")
            start = 0
            for r in members:
                mine = results[start : start + len(requests[r][0])]
                error = next((x for x in mine if isinstance(x, han.DocumentError)), None)
                out[r] = han.DocumentError(error.index - start, error.reason) if error else mine  # type: ignore[assignment]
                start += len(mine)
        return out


# The first added is the outermost: every response counts, a refused one too.
HANClassifier.add_asgi_middleware(SpreadConnections, requests=REQUESTS_PER_CONNECTION)
HANClassifier.add_asgi_middleware(ApiKeyGuard, keys=API_KEYS, open_metrics=os.environ.get(METRICS_OPEN_ENV) == "1",
                                  keys_file=os.environ.get(KEYS_FILE_ENV, "").strip() or None)
HANClassifier.add_asgi_middleware(RequestGuard)  # after the key check: a caller without a key is not read
