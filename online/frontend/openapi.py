"""The OpenAPI 3.0 description of the front end, served at ``/openapi.json``.

Written by hand, next to the handlers, rather than generated: the limits in it (largest k,
words per batch) come from the running settings, and the test suite runs schemathesis
against the live server with this document, so it cannot drift from the code unnoticed.
"""
from __future__ import annotations

from typing import Any

from online.frontend.settings import FrontendSettings

MAX_WORD_LENGTH = 1000
MAX_PREFIX_LENGTH = 200
MAX_VOCAB_LIMIT = 1000
MAX_ANALOGY_PARAM_LENGTH = 4000


def _json(schema_ref: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "invalid parameter or body", 404: "unknown word",
            503: "no model loaded yet, or too many requests in flight (see Retry-After)",
            413: "request body too large", 408: "the request body did not arrive in time",
            401: "missing or wrong 'Authorization: Bearer <token>'"}
    return {str(c): _json("Error", text[c]) for c in codes}


def build_openapi(settings: FrontendSettings) -> dict[str, Any]:
    """The document, with the guards' answers (``online.frontend.guards``) on the operations
    they can come from: 408 on bodies, 401 and the bearer scheme when a token is set."""
    doc = _document(settings)
    secured = settings.token() is not None
    if secured:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method == "post":
                op["responses"].update(_errors(408))
            if secured and (path.startswith("/v1/") or path == "/metrics"):
                op["security"] = [{"bearer": []}]
                op["responses"].update(_errors(401))
    return doc


def _document(settings: FrontendSettings) -> dict[str, Any]:
    k_param = {"name": "k", "in": "query", "required": False,
               "description": f"number of neighbours (1..{settings.max_k}, default 10)",
               "schema": {"type": "integer", "minimum": 1, "maximum": settings.max_k, "default": 10}}
    word_schema = {"type": "string", "minLength": 1, "maxLength": MAX_WORD_LENGTH}
    neighbours = {"type": "array", "items": {"$ref": "#/components/schemas/Neighbour"}}
    number_or_null = {"type": "number", "nullable": True}
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "livevec front end",
            "version": "1",
            "description": "Similarity queries on a word2vec model that keeps training on a Kafka stream. "
                           "Words are matched exactly, then in lower case. Scores are cosine similarities.",
        },
        "servers": [{"url": "/"}],
        "paths": {
            "/v1/similar": {
                "get": {
                    "operationId": "similar",
                    "summary": "nearest neighbours of one word",
                    "parameters": [
                        {"name": "word", "in": "query", "required": True, "schema": word_schema},
                        k_param,
                    ],
                    "responses": {"200": _json("Similar", "the k nearest words, best first"),
                                  **_errors(400, 404, 503)},
                },
                "post": {
                    "operationId": "similarBatch",
                    "summary": "nearest neighbours of several words in one request",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "$ref": "#/components/schemas/SimilarBatchRequest"}}}},
                    "responses": {"200": _json("SimilarBatch", "one result per word, in order; unknown words "
                                                               "carry an error instead of neighbours"),
                                  **_errors(400, 413, 503)},
                },
            },
            "/v1/analogy": {
                "get": {
                    "operationId": "analogy",
                    "summary": "3CosAdd analogy: words closest to sum(positive) - sum(negative)",
                    "parameters": [
                        {"name": "positive", "in": "query", "required": True,
                         "description": "comma-separated words, e.g. king,woman",
                         "schema": {"type": "string", "maxLength": MAX_ANALOGY_PARAM_LENGTH,
                                    "pattern": "[^,\\s]"}},
                        {"name": "negative", "in": "query", "required": False,
                         "description": "comma-separated words, e.g. man",
                         "schema": {"type": "string", "maxLength": MAX_ANALOGY_PARAM_LENGTH}},
                        k_param,
                    ],
                    "responses": {"200": _json("Analogy", "the k best answers, inputs excluded"),
                                  **_errors(400, 404, 503)},
                },
            },
            "/v1/vector/{word}": {
                "get": {
                    "operationId": "vector",
                    "summary": "the input vector (syn0) of a word",
                    "parameters": [{"name": "word", "in": "path", "required": True, "schema": word_schema}],
                    "responses": {"200": _json("Vector", "the raw (not normalised) vector"),
                                  **_errors(400, 404, 503)},
                },
            },
            "/v1/vocab": {
                "get": {
                    "operationId": "vocab",
                    "summary": "words starting with a prefix, most frequent first",
                    "parameters": [
                        {"name": "prefix", "in": "query", "required": False,
                         "schema": {"type": "string", "maxLength": MAX_PREFIX_LENGTH, "default": ""}},
                        {"name": "limit", "in": "query", "required": False,
                         "schema": {"type": "integer", "minimum": 1, "maximum": MAX_VOCAB_LIMIT, "default": 20}},
                    ],
                    "responses": {"200": _json("Vocab", "matching words with their counts"),
                                  **_errors(400, 503)},
                },
            },
            "/v1/stats": {
                "get": {
                    "operationId": "stats",
                    "summary": "model version and age, sync state, training statistics and a short history",
                    "responses": {"200": _json("Stats", "current statistics")},
                },
            },
            "/health": {"get": {"operationId": "health", "summary": "the process is alive",
                                "responses": {"200": _json("Health", "alive")}}},
            "/ready": {"get": {"operationId": "ready", "summary": "a model is loaded and queries are answered",
                               "responses": {"200": _json("Ready", "ready"),
                                             "503": _json("Ready", "no model loaded yet")}}},
            "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus text exposition format",
                                 "responses": {"200": {"description": "metrics",
                                                       "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": {"operationId": "openapi", "summary": "this document",
                                      "responses": {"200": {"description": "OpenAPI 3.0 document", "content": {
                                          "application/json": {"schema": {"type": "object"}}}}}}},
            "/": {"get": {"operationId": "page", "summary": "the live page",
                          "responses": {"200": {"description": "HTML page",
                                                "content": {"text/html": {"schema": {"type": "string"}}}}}}},
        },
        "components": {"schemas": {
            "Error": {"type": "object", "required": ["error", "message"], "properties": {
                "error": {"type": "string", "description": "machine-readable code, e.g. unknown_word, bad_k"},
                "message": {"type": "string"},
                "unknown": {"type": "array", "items": {"type": "string"}},
                "parameter": {"type": "string"},
            }},
            "Neighbour": {"type": "object", "required": ["word", "score"], "properties": {
                "word": {"type": "string"}, "score": {"type": "number"}}},
            "Similar": {"type": "object", "required": ["word", "version", "k", "neighbours"], "properties": {
                "word": {"type": "string", "description": "the vocabulary word that matched"},
                "version": {"type": "integer"}, "k": {"type": "integer"}, "neighbours": neighbours}},
            "SimilarBatchRequest": {"type": "object", "required": ["words"], "properties": {
                "words": {"type": "array", "minItems": 1, "maxItems": settings.max_batch_words, "items": word_schema},
                "k": {"type": "integer", "minimum": 1, "maximum": settings.max_k, "default": 10}}},
            "SimilarBatch": {"type": "object", "required": ["version", "k", "results"], "properties": {
                "version": {"type": "integer", "description": "the version of the first answer; each result "
                                                              "carries its own"},
                "k": {"type": "integer"},
                "results": {"type": "array", "items": {"type": "object", "required": ["word", "version"],
                                                       "properties": {
                    "word": {"type": "string"}, "version": {"type": "integer"}, "neighbours": neighbours,
                    "error": {"type": "string"}, "message": {"type": "string"}}}}}},
            "Analogy": {"type": "object", "required": ["positive", "negative", "version", "k", "neighbours"],
                        "properties": {
                "positive": {"type": "array", "items": {"type": "string"}},
                "negative": {"type": "array", "items": {"type": "string"}},
                "version": {"type": "integer"}, "k": {"type": "integer"}, "neighbours": neighbours}},
            "Vector": {"type": "object", "required": ["word", "key", "count", "dim", "version", "vector"],
                       "properties": {
                "word": {"type": "string"},
                "key": {"type": "string", "description": "the word's uint64 key, in decimal"},
                "count": {"type": "integer"}, "dim": {"type": "integer"}, "version": {"type": "integer"},
                "vector": {"type": "array", "items": {"type": "number"}}}},
            "Vocab": {"type": "object", "required": ["version", "prefix", "total", "words"], "properties": {
                "version": {"type": "integer"}, "prefix": {"type": "string"},
                "total": {"type": "integer", "description": "how many words have the prefix"},
                "words": {"type": "array", "items": {"type": "object", "required": ["word", "count"],
                                                     "properties": {"word": {"type": "string"},
                                                                    "count": {"type": "integer"}}}}}},
            "Stats": {"type": "object",
                      "required": ["ready", "version", "vocab_size", "dim", "model_time", "freshness_seconds",
                                   "words_trained", "words_per_second", "kafka_lag", "sync", "source", "history"],
                      "properties": {
                "ready": {"type": "boolean"},
                "version": {"type": "integer"},
                "vocab_size": {"type": "integer", "description": "words in the served copy"},
                "dim": {"type": "integer"},
                "model_time": {**number_or_null, "description": "unix time the served copy last changed"},
                "freshness_seconds": {**number_or_null,
                                      "description": "seconds since the copy was last confirmed current"},
                "words_trained": number_or_null,
                "words_per_second": number_or_null,
                "kafka_lag": number_or_null,
                "sync": {"type": "object"},
                "source": {"type": "object", "description": "what the model source reports"},
                "queries": {"type": "object"},
                "history": {"type": "array", "items": {"type": "object"}}}},
            "Health": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
            "Ready": {"type": "object", "required": ["ready"], "properties": {
                "ready": {"type": "boolean"}, "version": {"type": "integer"}}},
        }},
    }
