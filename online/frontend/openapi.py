"""The OpenAPI 3.0 description of the front end, served at ``/openapi.json``.

The document is data, ``resources/openapi.json``, filled in here with what it depends on: the running
settings (largest k, words per batch, the history's intervals), the limits the handlers enforce
(``limits``, ``query_body``, ``whats_new``) and the served model's dimension. The test suite runs
schemathesis against the live server with this document, so it cannot drift from the code unnoticed.

The template's three conventions, all expanded here:

- ``"{{name}}"``: a value from ``_values``; a string that is only the placeholder takes the value's
  type (a number, a list), a placeholder inside text its spelling (``%g`` for a float);
- ``{"$use": "name", ...}``: a copy of the fragment ``name`` (``fragments``), with the other keys
  of the object added after its own;
- ``"$errors": [400, 503]`` in a ``responses`` object: the JSON error answers with those statuses,
  described by ``errors``.
"""
from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import orjson

from online.frontend.limits import (MAX_ANALOGY_PARAM_LENGTH, MAX_CHECKPOINT_LENGTH, MAX_PREFIX_LENGTH, MAX_SINCE,
                                    MAX_VOCAB_LIMIT, MAX_WORD_LENGTH)
from online.frontend.query_body import MAX_COORDINATE, MAX_LIST_TERMS, MAX_VECTOR_DIM, MAX_WEIGHT, METHODS
from online.frontend.settings import FrontendSettings
from online.frontend.whats_new import MAX_LIMIT, RANKINGS

TEMPLATE = Path(__file__).with_name("resources") / "openapi.json"
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@functools.cache
def _template() -> dict[str, Any]:
    return orjson.loads(TEMPLATE.read_bytes())


def _values(settings: FrontendSettings, dim: int | None) -> dict[str, Any]:
    """What the template's placeholders stand for."""
    max_window = settings.rising_interval * settings.rising_samples
    return {
        "max_k": settings.max_k, "max_batch_words": settings.max_batch_words,
        "new_words_keep": settings.new_words_keep, "rising_interval": settings.rising_interval,
        "rising_samples": settings.rising_samples, "max_window": max_window,
        "default_window": min(300.0, max_window), "drift_interval": settings.drift_interval,
        "drift_keep": settings.drift_keep,
        "max_word_length": MAX_WORD_LENGTH, "max_prefix_length": MAX_PREFIX_LENGTH,
        "max_vocab_limit": MAX_VOCAB_LIMIT, "max_analogy_param_length": MAX_ANALOGY_PARAM_LENGTH,
        "max_since": MAX_SINCE, "max_checkpoint_length": MAX_CHECKPOINT_LENGTH, "max_limit": MAX_LIMIT,
        "rankings": list(RANKINGS), "methods": list(METHODS), "max_list_terms": MAX_LIST_TERMS,
        "max_vector_dim": MAX_VECTOR_DIM, "max_coordinate": MAX_COORDINATE, "min_coordinate": -MAX_COORDINATE,
        "max_weight": MAX_WEIGHT, "min_weight": -MAX_WEIGHT,
        # a query vector must have the served model's dimension (any, up to the limit, before a model)
        "vector_min_items": dim or 1, "vector_max_items": dim or MAX_VECTOR_DIM,
        "vector_dim_note": f" ({dim})" if dim else "",
    }


def build_openapi(settings: FrontendSettings, dim: int | None = None) -> dict[str, Any]:
    """The document, with the guards' answers (``online.frontend.guards``) on the operations
    they can come from: 408 on bodies, 401 and the bearer scheme when a token is set. ``dim``:
    the served model's dimension, which a query vector must have (unknown before a model)."""
    template = _template()
    filler = _Filler(_values(settings, dim), template["fragments"], template["errors"])
    doc = filler.fill(template["document"])
    secured = settings.token() is not None
    if secured:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method == "post":
                op["responses"].update(filler.errors([408]))
            if secured and (path.startswith("/v1/") or path == "/metrics"):
                op["security"] = [{"bearer": []}]
                op["responses"].update(filler.errors([401]))
    return doc


class _Filler:
    """The template's conventions (the module's docstring), expanded into a new document."""

    def __init__(self, values: dict[str, Any], fragments: dict[str, Any], error_texts: dict[str, str]):
        self.values, self.fragments, self.error_texts = values, fragments, error_texts

    def fill(self, node: Any, key: str | None = None) -> Any:
        if isinstance(node, dict):
            out = self.fill(self.fragments[node["$use"]]) if "$use" in node else {}
            for k, v in node.items():
                if k == "$use":
                    continue
                if k == "$errors" and key == "responses":
                    out.update(self.errors(v))
                else:
                    out[k] = self.fill(v, k)
            return out
        if isinstance(node, list):
            return [self.fill(v) for v in node]
        if isinstance(node, str) and "{{" in node:
            return self._text(node)
        return node

    def errors(self, codes: list[int]) -> dict[str, Any]:
        return {str(c): {"description": self.error_texts[str(c)],
                         "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
                for c in codes}

    def _text(self, text: str) -> Any:
        whole = _PLACEHOLDER.fullmatch(text)
        if whole:
            return copy.deepcopy(self._value(whole.group(1)))
        return _PLACEHOLDER.sub(lambda m: _spelled(self._value(m.group(1))), text)

    def _value(self, name: str) -> Any:
        if name in self.values:
            return self.values[name]
        return self.fill(self.fragments[name])      # a text fragment (KeyError: a name nobody defines)


def _spelled(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)
