"""For comparison only: the service built on BentoML's own adaptive batching (not what ships).

BentoML 1.4 batches only ``@bentoml.api(batchable=True)`` methods, behind its dispatcher. The
documented way to put one behind an API like ``/classify`` (several fields, per-request errors)
is a dependent service: ``HANClassifierAdaptive`` passes the documents to
``HANModelBatched.predict`` (its own process, reached over a Unix socket), whose dispatcher
gathers the documents of concurrent requests into one call of ``han.Pipeline``.

``benchmarks/serve_load.py --service benchmarks.adaptive_batching_service:HANClassifierAdaptive``
measures it beside the shipped service (see docs/experiments.md). ``HAN_PATCH_SESSION_REFRESH=1`` works
around BentoML 1.4.39 closing its client session to the dependency every 100 requests while
other requests are still in flight on it (they fail with "Server disconnected").
"""

from __future__ import annotations

import os
from uuid import uuid4

import bentoml
import torch
from pydantic import BaseModel

import han
from han.methods import explain_method
from model_store import default_model_tag
from service.api import ClassifyRequest, ClassifyResponse, Document
from service.guard import RequestGuard, error_response

MODEL_TAG = default_model_tag()


class ModelJob(BaseModel):
    text: str
    method: str | None


@bentoml.service(name="HANModelBatched", workers=1)
class HANModelBatched:
    bento_model = bentoml.models.BentoModel(MODEL_TAG)

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.pipeline = han.Pipeline(han.SavedModel.load(self.bento_model.path))

    @bentoml.api(batchable=True, max_batch_size=64, max_latency_ms=10_000)
    def predict(self, jobs: list[ModelJob]) -> list[han.DocumentResult | han.DocumentError]:
        results: list[han.DocumentResult | han.DocumentError] = [han.DocumentError(-1, "")] * len(jobs)
        for method in {job.method for job in jobs}:
            index = [i for i, job in enumerate(jobs) if job.method == method]
            texts = [jobs[i].text for i in index]
            out = self.pipeline(texts, explain=method, errors="return")
            for i, result in zip(index, out, strict=True):
                results[i] = result
        return results


@bentoml.service(name="HANClassifierAdaptive", workers=1, http={"host": "127.0.0.1"})
class HANClassifierAdaptive:
    model = bentoml.depends(HANModelBatched)

    def __init__(self) -> None:
        if os.environ.get("HAN_PATCH_SESSION_REFRESH") == "1" and hasattr(self.model, "_async"):
            self.model._async._session_manager.max_requests = 2**62
            self.model._async._session_manager.max_age = float("inf")

    @bentoml.api(route="/classify", input_spec=ClassifyRequest, output_spec=ClassifyResponse)
    async def classify(self, documents: list[str | Document], explain: bool | str = True) -> ClassifyResponse | object:
        method = explain_method(explain)
        texts = [d if isinstance(d, str) else d.text for d in documents]
        results = await self.model.to_async.predict([ModelJob(text=t, method=method) for t in texts])
        for i, result in enumerate(results):
            if isinstance(result, han.DocumentError) or "reason" in getattr(result, "__dict__", {}):
                return error_response(422, f"documents[{i}]: {result.reason}")
        request_id = uuid4().hex  # as the shipped service: every result with its document's id
        for i, (result, document) in enumerate(zip(results, documents, strict=True)):
            result.id = f"{request_id}-{i}" if isinstance(document, str) else document.id
        return ClassifyResponse.model_construct(request_id=request_id, results=results)


HANClassifierAdaptive.add_asgi_middleware(RequestGuard)
