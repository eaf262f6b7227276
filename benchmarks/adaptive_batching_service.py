"""For comparison only: the service built on BentoML's own adaptive batching (not what ships).

BentoML 1.4 batches only ``@bentoml.api(batchable=True)`` methods, behind its dispatcher. The
documented way to put one behind an API like ``/classify`` (several fields, per-request errors)
is a dependent service: ``HANClassifierAdaptive`` checks and segments the documents, then calls
``HANModelBatched.predict`` (its own process, reached over a Unix socket), whose dispatcher
gathers the documents of concurrent requests into one call of ``han.Predictor``.

``benchmarks/serve_load.py --service benchmarks.adaptive_batching_service:HANClassifierAdaptive``
measures it beside the shipped service (see BENCHMARKS.md). ``HAN_PATCH_SESSION_REFRESH=1`` works
around BentoML 1.4.39 closing its client session to the dependency every 100 requests while
other requests are still in flight on it (they fail with "Server disconnected").
"""

from __future__ import annotations

import os

import bentoml
import torch
from pydantic import BaseModel
from starlette.responses import Response

import han
from han import InvalidDocumentError, Segment
from service.service import MODEL_TAG, ClassifyRequest, ClassifyResponse, RequestGuard, error_response, render


class ModelJob(BaseModel):
    segment: Segment
    explain: bool


@bentoml.service(name="HANModelBatched", workers=1)
class HANModelBatched:
    bento_model = bentoml.models.BentoModel(MODEL_TAG)

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.predictor = han.Predictor(han.SavedModel.load(self.bento_model.path))

    @bentoml.api(batchable=True, max_batch_size=64, max_latency_ms=10_000)
    def predict(self, jobs: list[ModelJob]) -> list[str]:
        results = [""] * len(jobs)
        for explain in (True, False):
            index = [i for i, job in enumerate(jobs) if job.explain is explain]
            if index:
                predictions = self.predictor.predict_segments([jobs[i].segment for i in index], explain=explain)
                for i, prediction in zip(index, predictions, strict=True):
                    results[i] = render(prediction)
        return results


@bentoml.service(name="HANClassifierAdaptive", workers=1, http={"host": "127.0.0.1"})
class HANClassifierAdaptive:
    bento_model = bentoml.models.BentoModel(MODEL_TAG)
    model = bentoml.depends(HANModelBatched)

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.predictor = han.Predictor(han.SavedModel.load(self.bento_model.path))  # to segment only
        if os.environ.get("HAN_PATCH_SESSION_REFRESH") == "1" and hasattr(self.model, "_async"):
            self.model._async._session_manager.max_requests = 2**62
            self.model._async._session_manager.max_age = float("inf")

    @bentoml.api(route="/classify", input_spec=ClassifyRequest, output_spec=ClassifyResponse)
    async def classify(self, documents: list[str], explain: bool = True) -> ClassifyResponse:
        try:
            segments = self.predictor.segment(documents)
        except InvalidDocumentError as e:
            return error_response(422, f"documents[{e.index}]: {e.reason}")  # type: ignore[return-value]
        parts = await self.model.to_async.predict([ModelJob(segment=s, explain=explain) for s in segments])
        return Response('{"results":[' + ",".join(parts) + "]}", media_type="application/json")  # type: ignore[return-value]


HANClassifierAdaptive.add_asgi_middleware(RequestGuard)
