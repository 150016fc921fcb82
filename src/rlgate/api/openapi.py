"""OpenAPI documentation for routes that read their JSON body themselves.

The API surfaces parse bodies by hand (to answer bad input in their own error shape),
so FastAPI cannot infer the request schema; :func:`body_schema` declares it, and
:func:`install_openapi` merges the models' ``$defs`` into ``components.schemas``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

_REF = "#/components/schemas/{model}"


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(ref_template=_REF, mode="validation")


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = _schema(model)
    schema.pop("$defs", None)
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "x-rlgate-body-model": f"{model.__module__}.{model.__qualname__}",
    }


def install_openapi(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """The app's OpenAPI document. A route the app serves through Starlette (which FastAPI
    would not document) is documented by the FastAPI route it stands for (``api_route``)."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=[getattr(r, "api_route", r) for r in app.routes],
                          description=app.description)
        comps = doc.setdefault("components", {}).setdefault("schemas", {})
        for m in models:
            for name, sub in (_schema(m).get("$defs") or {}).items():
                comps.setdefault(name, sub)
        for path in doc.get("paths", {}).values():
            for op in path.values():
                if isinstance(op, dict):
                    op.pop("x-rlgate-body-model", None)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
