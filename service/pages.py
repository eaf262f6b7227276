"""The pages beside the API: the web page, ``GET /model``, and the API documentation (``/docs``).

BentoML's OpenAPI document knows the ``/classify`` API; it is completed here with the GET routes
and the error bodies the request guard sends, and its request body is replaced by ClassifyRequest's
own schema, required: BentoML's keeps only the first member of a union (``explain`` would read as a
boolean, a document as a string).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import bentoml
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from service.api import MAX_BODY_BYTES, MAX_DOCUMENTS, ClassifyRequest, ErrorBody, ModelInfo
from service.feedback import MAX_FEEDBACK, FeedbackResponse
from service.monitor_page import SINCE_PATTERN

STATIC = Path(__file__).resolve().parent / "static"


def make_pages(service: Callable[[], Any], version: str,
               feedback_request: Callable[[], type[BaseModel] | None] = lambda: None) -> Starlette:
    """The ASGI app mounted at ``/``; ``service()`` gives the BentoML service (defined after this app);
    ``feedback_request()`` is ``POST /feedback``'s request type for the version served now (its labels), for
    the API document."""
    specs: dict[Any, dict[str, Any]] = {}  # by request type: the document follows a promotion

    async def index_page(_: Request) -> Response:
        return HTMLResponse((STATIC / "index.html").read_bytes())

    async def monitor_page(_: Request) -> Response:
        return HTMLResponse((STATIC / "monitor.html").read_bytes())

    async def model_info(_: Request) -> Response:
        return JSONResponse(bentoml.get_current_service().info.model_dump(mode="json"))

    async def docs_page(_: Request) -> Response:
        import _bentoml_impl.server

        return FileResponse(Path(_bentoml_impl.server.__file__).parent / "main-openapi.html")

    async def feedback(request: Request) -> Response:
        return await bentoml.get_current_service().feedback_api(request)

    async def monitor(request: Request) -> Response:
        return await bentoml.get_current_service().monitor_api(request)

    async def openapi_json(_: Request) -> Response:
        request_type = feedback_request()
        if request_type not in specs:
            specs.clear()
            specs[request_type] = openapi_document(service().openapi_spec.asdict(), version, request_type)
        return JSONResponse(specs[request_type])

    return Starlette(
        routes=[
            Route("/", index_page, methods=["GET"]),
            Route("/model", model_info, methods=["GET"]),
            Route("/feedback", feedback, methods=["POST"]),
            Route("/monitor", monitor, methods=["GET"]),
            Route("/dashboard", monitor_page, methods=["GET"]),
            Route("/docs", docs_page, methods=["GET"]),
            Route("/docs.json", openapi_json, methods=["GET"]),
        ]
    )


def openapi_document(spec: dict[str, Any], version: str, feedback_request: type[BaseModel] | None = None
                     ) -> dict[str, Any]:
    """BentoML's OpenAPI document for the service, plus the routes and error bodies it does not see."""
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    ref = "#/components/schemas/{model}"
    schemas.pop("ClassifyRequestIODescriptor", None)  # BentoML's lossy copy of ClassifyRequest
    # han.Pipeline's results have no id (None); every result the service sends has one.
    result = schemas["DocumentResult"]
    result["properties"]["id"] = {"type": "string", "description": result["properties"]["id"]["description"]}
    result["required"] = ["id", *(name for name in result.get("required", []) if name != "id")]
    for model in (ClassifyRequest, ModelInfo, ErrorBody):
        schema = _openapi_30(model.model_json_schema(ref_template=ref))
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    spec["info"].update(
        title="HAN document classifier",
        version=version,
        description="Classify documents with a Hierarchical Attention Network and see what it attended to: "
        "`POST /classify` gives each document's label, calibrated scores and (with `explain`) the weight of "
        "every sentence and word by the chosen method, with character offsets into the text. `GET /model` "
        "describes the model and how faithful each method was; "
        '`GET /` is a web page. Errors are JSON `{"error": "..."}` with a 4xx status.',
    )

    def error(description: str) -> dict[str, Any]:
        return {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": ref.format(model="ErrorBody")}}},
        }

    classify = spec["paths"]["/classify"]["post"]
    classify["summary"] = "Classify documents and explain the predictions"
    classify["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": ref.format(model="ClassifyRequest")}}},
    }
    # BentoML keys responses by int: make them strings before adding ours (else "400" appears twice).
    classify["responses"] = {str(k): v for k, v in classify["responses"].items() if str(k) != "404"}
    classify["responses"].update(
        {
            "400": error("The body is empty, not UTF-8 or not JSON."),
            "413": error(f"The body is over {MAX_BODY_BYTES / 2**20:g} MB."),
            "415": error("The body is multipart or pickle, not JSON."),
            "422": error(f"The JSON does not fit the schema (e.g. a document without a word, or over {MAX_DOCUMENTS} "
                         "documents), or a text has no word within the model's caps."),
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
    if feedback_request is not None:
        _feedback_paths(spec, schemas, feedback_request, ref, error)
    spec["paths"]["/"] = {
        "get": {
            "summary": "The web page: type a document, see its label and what the model attended to",
            "operationId": "HANClassifier__index",
            "tags": ["Service APIs"],
            "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}},
        }
    }
    spec["paths"]["/dashboard"] = {
        "get": {
            "summary": "The monitor's page: GET /monitor's report as charts over time",
            "operationId": "HANClassifier__dashboard",
            "tags": ["Service APIs"],
            "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}},
        }
    }
    return spec


def _feedback_paths(spec: dict[str, Any], schemas: dict[str, Any], request: type[BaseModel], ref: str,
                    error: Any) -> None:
    """``POST /feedback`` and ``GET /monitor``, which the pages app serves."""
    for model in (request, FeedbackResponse):
        schema = _openapi_30(model.model_json_schema(ref_template=ref))
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    spec["paths"]["/feedback"] = {
        "post": {
            "summary": "The true label(s) of documents the service classified, by their ids",
            "operationId": "HANClassifier__feedback",
            "tags": ["Service APIs"],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": ref.format(model=request.__name__)}}}},
            "responses": {
                "200": {"description": "Stored (a later feedback for an id replaces the earlier one).",
                        "content": {"application/json": {"schema": {"$ref": ref.format(model="FeedbackResponse")}}}},
                "400": error("The body is empty or not JSON."),
                "404": error("Some ids were never classified: they are named, and the other items are stored."),
                "413": error("The body is over 1 MB."),
                "422": error(f"The JSON does not fit the schema (e.g. a label the model does not have, or over "
                             f"{MAX_FEEDBACK} items): nothing was stored."),
                "503": error("The feedback store cannot be reached: nothing was stored."),
            },
        }
    }
    spec["paths"]["/monitor"] = {
        "get": {
            "summary": "The model in production: accuracy estimated and on feedback, input shift, over time",
            "operationId": "HANClassifier__monitor",
            "tags": ["Service APIs"],
            "parameters": [{"name": "since", "in": "query", "required": False, "description":
                            "The window: a span back from now (30m, 24h, 7d; at most 30 days).",
                            "schema": {"type": "string", "pattern": SINCE_PATTERN, "default": "24h"}}],
            "responses": {
                "200": {"description": "Each version's report (han-model monitor), with its series over time.",
                        "content": {"application/json": {"schema": {"type": "object"}}}},
                "422": error("since is not a span."),
                "503": error("The feedback store cannot be reached."),
            },
        }
    }


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
