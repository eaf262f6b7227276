"""The pages beside the API: the web page, ``GET /model``, and the API documentation (``/docs``).

BentoML's OpenAPI document knows the ``/classify`` API; it is completed here with the GET routes
and the error bodies the request guard sends.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import bentoml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from service.api import MAX_BODY_BYTES, MAX_DOCUMENTS, ErrorBody, ModelInfo

STATIC = Path(__file__).resolve().parent / "static"


def make_pages(service: Callable[[], Any], version: str) -> Starlette:
    """The ASGI app mounted at ``/``; ``service()`` gives the BentoML service (defined after this app)."""
    spec: dict[str, Any] = {}

    async def index_page(_: Request) -> Response:
        return HTMLResponse((STATIC / "index.html").read_bytes())

    async def model_info(_: Request) -> Response:
        return JSONResponse(bentoml.get_current_service().info.model_dump(mode="json"))

    async def docs_page(_: Request) -> Response:
        import _bentoml_impl.server

        return FileResponse(Path(_bentoml_impl.server.__file__).parent / "main-openapi.html")

    async def openapi_json(_: Request) -> Response:
        if not spec:
            spec.update(openapi_document(service().openapi_spec.asdict(), version))
        return JSONResponse(spec)

    return Starlette(
        routes=[
            Route("/", index_page, methods=["GET"]),
            Route("/model", model_info, methods=["GET"]),
            Route("/docs", docs_page, methods=["GET"]),
            Route("/docs.json", openapi_json, methods=["GET"]),
        ]
    )


def openapi_document(spec: dict[str, Any], version: str) -> dict[str, Any]:
    """BentoML's OpenAPI document for the service, plus the GET routes and error bodies it does not see."""
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    ref = "#/components/schemas/{model}"
    for model in (ModelInfo, ErrorBody):
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
