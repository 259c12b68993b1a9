"""The OpenAPI 3.0 description of the front end, served at ``/openapi.json``.

Written by hand, next to the handlers, rather than generated: the limits in it (largest k,
words per batch) come from the running settings, and the test suite runs schemathesis
against the live server with this document, so it cannot drift from the code unnoticed.
"""
from __future__ import annotations

from typing import Any

from online.frontend.query_body import MAX_COORDINATE, MAX_LIST_TERMS, MAX_VECTOR_DIM, MAX_WEIGHT, METHODS
from online.frontend.settings import FrontendSettings
from online.frontend.whats_new import MAX_LIMIT, RANKINGS

MAX_WORD_LENGTH = 1000
MAX_PREFIX_LENGTH = 200
MAX_VOCAB_LIMIT = 1000
MAX_ANALOGY_PARAM_LENGTH = 4000
MAX_SINCE = 1e11                 # unix seconds (year 5138): later is a typo, not a time
MAX_CHECKPOINT_LENGTH = 40
EXPORT_HEADERS = {"X-Model-Version": "the model version every row comes from",
                  "X-Model-Rows": "rows in the file (also its header line)", "X-Model-Dim": "vector dimension",
                  "X-Model-Skipped": "words left out because a word2vec file cannot hold them (empty, or a "
                                     "whitespace word whose escaped spelling is another word)"}


def _json(schema_ref: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "invalid parameter or body", 404: "unknown word",
            503: "no model loaded yet, too many requests in flight, or too many queries waiting (error "
                 "overloaded: load shedding; see Retry-After)",
            413: "request body too large", 408: "the request body did not arrive in time",
            401: "missing or wrong 'Authorization: Bearer <token>'"}
    return {str(c): _json("Error", text[c]) for c in codes}


def build_openapi(settings: FrontendSettings, dim: int | None = None) -> dict[str, Any]:
    """The document, with the guards' answers (``online.frontend.guards``) on the operations
    they can come from: 408 on bodies, 401 and the bearer scheme when a token is set. ``dim``:
    the served model's dimension, which a query vector must have (unknown before a model)."""
    doc = _document(settings)
    for path, item in _query_paths(settings).items():
        doc["paths"].setdefault(path, {}).update(item)
    doc["components"]["schemas"].update(_query_schemas(settings, dim))
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
    searched = {"type": "string", "enum": ["exact", "ivf"],
                "description": "how the neighbours were found: exact (every row), or ivf (the inverted file's "
                               "nearest lists only: approximate, /v1/stats gives its measured recall@10)"}
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
                    "description": 'Either {"words": [...]}: the neighbours of each word (one result each), or '
                                   'a query of words and vectors, {"positive": [...], "negative": [...]} or '
                                   '{"vector": [...]}, answered as in POST /v1/analogy (a body with "words" is '
                                   "the first kind). Words travel as JSON strings, so they may hold any "
                                   "character, commas included.",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {"anyOf": [
                        {"$ref": "#/components/schemas/SimilarBatchRequest"},
                        {"$ref": "#/components/schemas/TermQueryRequest"},
                        {"$ref": "#/components/schemas/VectorQueryRequest"}]}}}},
                    "responses": {"200": {"description": "one result per word, in order (unknown words carry an "
                                                         "error instead of neighbours); or the query's answer",
                                          "content": {"application/json": {"schema": {"oneOf": [
                                              {"$ref": "#/components/schemas/SimilarBatch"},
                                              {"$ref": "#/components/schemas/TermQuery"}]}}}},
                                  **_errors(400, 404, 413, 503)},
                },
            },
            "/v1/analogy": {
                "get": {
                    "operationId": "analogy",
                    "summary": "3CosAdd analogy: words closest to sum(positive) - sum(negative)",
                    "parameters": [
                        {"name": "positive", "in": "query", "required": True,
                         "description": "comma-separated words, e.g. king,woman (a word holding a comma: "
                                        "POST /v1/analogy with a JSON body)",
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
            "/v1/export": {
                "get": {
                    "operationId": "export",
                    "summary": "the whole model as one word2vec file, streamed from one snapshot",
                    "description": "Every row comes from the model version in X-Model-Version, however long the "
                                   "download takes. Rows go out most frequent first. binary and text are "
                                   "word2vec.c's formats (gensim's load_word2vec_format reads both); vocab is "
                                   "'word count' per line, without vectors. Those three end a word at a space, "
                                   "so a word holding whitespace is written with each whitespace character "
                                   "percent-escaped as its UTF-8 bytes ('two words' -> 'two%20words', a tab "
                                   "%09); every other word byte for byte, '%' included (the escape is one way). "
                                   "words is every word exactly, one JSON array [word, count] per line, in the "
                                   "same order.",
                    "parameters": [{"name": "format", "in": "query", "required": False,
                                    "schema": {"type": "string", "enum": ["binary", "text", "vocab", "words"],
                                               "default": "binary"}}],
                    "responses": {"200": {"description": "the file, chunked",
                                          "headers": {name: {"description": text, "schema": {"type": "integer"}}
                                                      for name, text in EXPORT_HEADERS.items()},
                                          "content": {"application/octet-stream": {"schema": {
                                                          "type": "string", "format": "binary"}},
                                                      "text/plain": {"schema": {"type": "string"}},
                                                      "application/x-ndjson": {"schema": {"type": "string"}}}},
                                  **_errors(400, 503)},
                },
            },
            **_whats_new_paths(settings, k_param, word_schema),
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
                "reason": {"type": "string", "description": "with overloaded from the query queue: queue_full, "
                                                           "wait_estimate or deadline"},
                "checkpoints": {"type": "array", "items": {"type": "integer"},
                                "description": "with unknown_checkpoint: the ids kept"},
            }},
            **_whats_new_schemas(neighbours, number_or_null),
            "Neighbour": {"type": "object", "required": ["word", "score"], "properties": {
                "word": {"type": "string"}, "score": {"type": "number"}}},
            "Similar": {"type": "object", "required": ["word", "version", "k", "neighbours"], "properties": {
                "word": {"type": "string", "description": "the vocabulary word that matched"},
                "version": {"type": "integer"}, "k": {"type": "integer"}, "search": searched,
                "neighbours": neighbours}},
            "SimilarBatchRequest": {"type": "object", "required": ["words"], "properties": {
                "words": {"type": "array", "minItems": 1, "maxItems": settings.max_batch_words, "items": word_schema},
                "k": {"type": "integer", "minimum": 1, "maximum": settings.max_k, "default": 10}}},
            "SimilarBatch": {"type": "object", "required": ["version", "k", "results"], "properties": {
                "version": {"type": "integer", "description": "the version of the first answer; each result "
                                                              "carries its own"},
                "k": {"type": "integer"},
                "results": {"type": "array", "items": {"type": "object", "required": ["word", "version"],
                                                       "properties": {
                    "word": {"type": "string"}, "version": {"type": "integer"}, "search": searched,
                    "neighbours": neighbours, "error": {"type": "string"}, "message": {"type": "string"}}}}}},
            "Analogy": {"type": "object", "required": ["positive", "negative", "version", "k", "neighbours"],
                        "properties": {
                "positive": {"type": "array", "items": {"type": "string"}},
                "negative": {"type": "array", "items": {"type": "string"}},
                "version": {"type": "integer"}, "k": {"type": "integer"}, "search": searched,
                "neighbours": neighbours}},
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
                                   "words_trained", "words_per_second", "kafka_lag", "training", "sync", "source",
                                   "history"],
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
                "records_malformed": {"type": "object", "nullable": True,
                                      "additionalProperties": {"type": "integer"},
                                      "description": "records the live workers skipped as malformed since they "
                                                     "started, by reason (invalid_json, missing_field, ...; null: "
                                                     "the source has none); still committed in order"},
                "training": {"type": "object", "nullable": True,
                             "description": "the workers' training signal (null: the source has none): loss is "
                                            "the SGNS loss per sampled pair over the workers' last 30 s, "
                                            "hot_row_norm the worst worker's mean and max L2 norm of the input "
                                            "and output rows of its 100 most frequent words (healthy 1 - 5), "
                                            "diverging whether some worker's mean is beyond hot_row_norm_bound "
                                            "or overflowed (nonfinite_rows, nonfinite_batches), workers each "
                                            "worker's figures",
                             "properties": {
                                 "loss": number_or_null, "loss_pairs": {"type": "integer"},
                                 "hot_row_norm": {"type": "object", "nullable": True},
                                 "hot_row_norm_bound": {"type": "number"},
                                 "nonfinite_batches": {"type": "integer"}, "nonfinite_rows": {"type": "integer"},
                                 "diverging": {"type": "boolean"},
                                 "workers": {"type": "array", "items": {"type": "object"}}}},
                "sync": {"type": "object"},
                "source": {"type": "object", "description": "what the model source reports"},
                "queries": {"type": "object"},
                "search": {"type": "object", "description": "how queries are answered (exact or ivf), the inverted "
                                                            "file's state and measured recall@10, load shedding"},
                "history": {"type": "array", "items": {"type": "object"}}}},
            "Health": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
            "Ready": {"type": "object", "required": ["ready"], "properties": {
                "ready": {"type": "boolean"}, "version": {"type": "integer"}}},
        }},
    }


# ------------------------------------------------------------- what is new (online/frontend/whats_new.py)
def _whats_new_paths(settings: FrontendSettings, k_param: dict, word_schema: dict) -> dict[str, Any]:
    max_window = settings.rising_interval * settings.rising_samples
    limit = {"name": "limit", "in": "query", "required": False, "description": f"most words listed (1..{MAX_LIMIT})",
             "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 20}}
    recorded = ("Answered from the history this front end records itself from the snapshots it serves "
                "(GET /v1/history shows its reach), not from the servers: it starts empty when the front end "
                "starts, and memory and time stay bounded by LIVEVEC_NEW_WORDS_KEEP, LIVEVEC_RISING_* and "
                "LIVEVEC_DRIFT_*.")
    return {
        "/v1/new": {"get": {
            "operationId": "newWords",
            "summary": "words that became trainable since a time, newest first",
            "description": "A word reaches the front end when it reaches min_count and the next sync brings its "
                           "row; first_seen is when this front end first served it (to within a sync interval). "
                           "Words of the first model it loaded have no arrival time (observed_since). At most "
                           f"LIVEVEC_NEW_WORDS_KEEP={settings.new_words_keep} arrivals are remembered; complete "
                           "is false when some after since were forgotten or predate observed_since. Cost: "
                           "O(a log n) for the a arrivals since since. " + recorded,
            "parameters": [
                {"name": "since", "in": "query", "required": False,
                 "description": "unix seconds (default 0: every arrival remembered)",
                 "schema": {"type": "number", "minimum": 0, "maximum": MAX_SINCE, "default": 0}},
                limit],
            "responses": {"200": _json("NewWords", "the arrivals, newest first"), **_errors(400, 503)},
        }},
        "/v1/rising": {"get": {
            "operationId": "rising",
            "summary": "words whose counts rise fastest over a window",
            "description": "The rise of a word is its count now minus its count in the newest count sample at "
                           f"least window seconds old (samples every LIVEVEC_RISING_INTERVAL="
                           f"{settings.rising_interval:g} s, {settings.rising_samples} kept, so the window is "
                           f"at most {max_window:g} s; span_seconds says the span measured, partial that the "
                           "history is shorter than the window). by=rise ranks by the increase; by=lift by "
                           "(rise + 1) / (expected + 1), expected being the rise the word's earlier share of "
                           "all counts predicts, so a word used far more than usual beats a frequent word used "
                           "as usual. Only words present at both ends; arrivals are /v1/new. Cost: one "
                           "vectorised pass over the vocabulary. " + recorded,
            "parameters": [
                {"name": "window", "in": "query", "required": False,
                 "description": f"seconds (above 0, at most {max_window:g}; default {min(300.0, max_window):g})",
                 "schema": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": max_window,
                            "default": min(300.0, max_window)}},
                limit,
                {"name": "by", "in": "query", "required": False,
                 "schema": {"type": "string", "enum": list(RANKINGS), "default": "rise"}}],
            "responses": {"200": _json("Rising", "the words whose counts rose, best first"), **_errors(400, 503)},
        }},
        "/v1/drift": {"get": {
            "operationId": "drift",
            "summary": "a word's neighbours now against a past checkpoint: overlap@k, entered and left",
            "description": "Checkpoints are this front end's own, in memory: the first model it served, then "
                           f"one every LIVEVEC_DRIFT_INTERVAL={settings.drift_interval:g} s while the model "
                           f"changes, the last LIVEVEC_DRIFT_KEEP={settings.drift_keep} kept (each a float16 "
                           "copy of the vectors, 2 dim + 20 bytes per word), numbered from 1 since its start; "
                           "not the cluster's coordinated checkpoints. oldest is the oldest kept, previous the "
                           "newest that differs from the served model. Neighbours now are exact, as /v1/similar; "
                           "neighbours then are exact over the float16 vectors (scores within about 1e-3). Cost: "
                           "two searches. A word that arrived after the checkpoint has in_checkpoint false and "
                           "all its neighbours entered. " + recorded,
            "parameters": [
                {"name": "word", "in": "query", "required": True, "schema": word_schema},
                k_param,
                {"name": "checkpoint", "in": "query", "required": False,
                 "description": "'oldest', 'previous' or an id from GET /v1/history",
                 "schema": {"type": "string", "minLength": 1, "maxLength": MAX_CHECKPOINT_LENGTH,
                            "default": "oldest"}}],
            "responses": {"200": _json("Drift", "neighbours now and then"), **_errors(400, 503),
                          "404": _json("Error", "unknown word (unknown_word) or checkpoint (unknown_checkpoint)")},
        }},
        "/v1/history": {"get": {
            "operationId": "history",
            "summary": "the history /v1/new, /v1/rising and /v1/drift answer from: checkpoints and reach",
            "responses": {"200": _json("History", "what this front end remembers")},
        }},
    }


def _whats_new_schemas(neighbours: dict, number_or_null: dict) -> dict[str, Any]:
    integer_or_null = {"type": "integer", "nullable": True}
    checkpoint = {"type": "object", "required": ["id", "taken_at", "version", "vocab_size"], "properties": {
        "id": {"type": "integer"}, "taken_at": {"type": "number", "description": "unix seconds"},
        "version": {"type": "integer"}, "vocab_size": {"type": "integer"}}}
    return {
        "NewWords": {"type": "object", "required": ["version", "since", "now", "observed_since", "complete", "total",
                                                    "words"], "properties": {
            "version": {"type": "integer"}, "since": {"type": "number"},
            "now": {"type": "number", "description": "the front end's clock (unix s), for relative times"},
            "observed_since": {**number_or_null, "description": "when the front end loaded its first model"},
            "complete": {"type": "boolean", "description": "every arrival since since is known"},
            "total": {"type": "integer", "description": "arrivals since since still in the model"},
            "words": {"type": "array", "items": {"type": "object", "required": ["word", "first_seen", "count"],
                                                 "properties": {"word": {"type": "string"},
                                                                "first_seen": {"type": "number"},
                                                                "count": {"type": "integer"}}}}}},
        "Rising": {"type": "object", "required": ["version", "by", "window_seconds", "from", "to", "span_seconds",
                                                  "partial", "words"], "properties": {
            "version": {"type": "integer"}, "by": {"type": "string"}, "window_seconds": {"type": "number"},
            "from": {"type": "number", "description": "unix s of the count sample compared with"},
            "to": {"type": "number"}, "span_seconds": {"type": "number"}, "partial": {"type": "boolean"},
            "words": {"type": "array", "items": {"type": "object", "required": [
                "word", "count", "count_then", "rise", "per_second", "lift"], "properties": {
                "word": {"type": "string"}, "count": {"type": "integer"}, "count_then": {"type": "integer"},
                "rise": {"type": "integer"}, "per_second": {"type": "number"}, "lift": {"type": "number"}}}}}},
        "Drift": {"type": "object", "required": ["word", "k", "version", "checkpoint", "in_checkpoint", "overlap",
                                                 "shared", "self_similarity", "entered", "left", "now", "then"],
                  "properties": {
            "word": {"type": "string"}, "k": {"type": "integer"}, "version": {"type": "integer"},
            "checkpoint": {**checkpoint, "required": [*checkpoint["required"], "age_seconds"],
                           "properties": {**checkpoint["properties"], "age_seconds": {"type": "number"}}},
            "in_checkpoint": {"type": "boolean"},
            "overlap": {"type": "number", "minimum": 0, "maximum": 1, "description": "shared / k (overlap@k)"},
            "shared": {"type": "integer"},
            "self_similarity": {**number_or_null, "description": "cosine of the word's vector now and then"},
            "entered": {**neighbours, "description": "neighbours now that were not then (scores now)"},
            "left": {**neighbours, "description": "neighbours then that are not now (scores then)"},
            "now": neighbours, "then": neighbours}},
        "History": {"type": "object", "required": ["now", "version", "observed_since", "checkpoints", "drift",
                                                   "rising", "new_words"], "properties": {
            "now": {"type": "number"}, "version": integer_or_null, "observed_since": number_or_null,
            "checkpoints": {"type": "array", "items": checkpoint},
            "drift": {"type": "object", "properties": {"interval_seconds": {"type": "number"},
                                                       "keep": {"type": "integer"}}},
            "rising": {"type": "object", "properties": {
                "interval_seconds": {"type": "number"}, "samples": {"type": "integer"}, "keep": {"type": "integer"},
                "max_window_seconds": {"type": "number"}, "oldest_sample_at": number_or_null}},
            "new_words": {"type": "object", "properties": {
                "remembered": {"type": "integer"}, "keep": {"type": "integer"},
                "forgotten_until": number_or_null}}}},
    }


# ------------------------------------------------- queries by words and vectors (online/frontend/query_body.py)
def _query_paths(settings: FrontendSettings) -> dict[str, Any]:
    word = {"type": "string", "minLength": 1, "maxLength": MAX_WORD_LENGTH}
    return {
        "/v1/analogy": {"post": {
            "operationId": "analogyQuery",
            "summary": "words nearest to a weighted sum of words and vectors (gensim's most_similar), or 3CosMul",
            "description": "method add (default): the direction is the sum of the positive terms minus the "
                           "negative ones, words as unit vectors and vectors as given, each times its weight, "
                           "normalised; the answer is the k words of highest cosine to it, the query's words left "
                           "out (gensim's most_similar). A sum of zero has no direction: every score is 0. "
                           "method mul: 3CosMul (gensim's most_similar_cosmul), exact over the vocabulary. "
                           "Terms travel as JSON, so a word may hold any character.",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "$ref": "#/components/schemas/TermQueryRequest"}}}},
            "responses": {"200": _json("TermQuery", "the k best words, inputs excluded"),
                          **_errors(400, 404, 413, 503)},
        }},
        "/v1/closer": {"get": {
            "operationId": "closer",
            "summary": "every word more similar to word than than is (gensim's closer_than; rank is count + 1)",
            "description": "A full scan, exact; the words come most frequent first (index_to_key's order).",
            "parameters": [{"name": "word", "in": "query", "required": True, "schema": word},
                           {"name": "than", "in": "query", "required": True, "schema": word}],
            "responses": {"200": _json("Closer", "the words, most frequent first"), **_errors(400, 404, 503)},
        }},
    }


def _query_schemas(settings: FrontendSettings, dim: int | None) -> dict[str, Any]:
    length = {"minItems": dim, "maxItems": dim} if dim else {"minItems": 1, "maxItems": MAX_VECTOR_DIM}
    vector = {"type": "array", **length, "description": "a raw vector of the model's dimension"
                                                        + (f" ({dim})" if dim else ""),
              "items": {"type": "number", "minimum": -MAX_COORDINATE, "maximum": MAX_COORDINATE}}
    word = {"type": "string", "minLength": 1, "maxLength": MAX_WORD_LENGTH}
    weight = {"type": "number", "minimum": -MAX_WEIGHT, "maximum": MAX_WEIGHT}
    term = {"oneOf": [word, vector,
                      {"type": "object", "required": ["word"], "additionalProperties": False,
                       "properties": {"word": word, "weight": weight}},
                      {"type": "object", "required": ["vector"], "additionalProperties": False,
                       "properties": {"vector": vector, "weight": weight}}],
            "description": "a word (weight +1 in positive, -1 in negative), a vector, or either with a weight"}
    terms = {"type": "array", "maxItems": MAX_LIST_TERMS, "items": term}
    k = {"type": "integer", "minimum": 1, "maximum": settings.max_k, "default": 10}
    resolved = {"type": "array", "items": {"type": "string", "nullable": True},
                "description": "the vocabulary word each term matched; null for a vector"}
    neighbours = {"type": "array", "items": {"$ref": "#/components/schemas/Neighbour"}}
    return {
        "TermQueryRequest": {"type": "object", "required": ["positive"],
                             "properties": {"positive": {**terms, "minItems": 1}, "negative": terms, "k": k,
                                            "method": {"type": "string", "enum": list(METHODS), "default": "add",
                                                       "description": "add (3CosAdd) or mul (3CosMul: weights "
                                                                      "are ignored, the list says the side)"}}},
        "VectorQueryRequest": {"type": "object", "required": ["vector"], "properties": {"vector": vector, "k": k}},
        "TermQuery": {"type": "object", "required": ["positive", "negative", "method", "version", "k", "neighbours"],
                      "properties": {"positive": resolved, "negative": resolved,
                                     "method": {"type": "string", "enum": list(METHODS)},
                                     "version": {"type": "integer"}, "k": {"type": "integer"},
                                     "search": {"type": "string", "enum": ["exact", "ivf"]},
                                     "neighbours": neighbours}},
        "Closer": {"type": "object", "required": ["word", "than", "version", "count", "words"], "properties": {
            "word": {"type": "string"}, "than": {"type": "string"}, "version": {"type": "integer"},
            "count": {"type": "integer"}, "words": neighbours}},
    }
