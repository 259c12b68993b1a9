"""``livevec frontend``: the aiohttp application that answers similarity queries live.

Layout follows aiohttp's own examples: ``create_app`` is the application factory,
handlers only parse the request, call the model and format the answer, and the
long-lived pieces (the query thread, the sync loop, the stats loop) are started and
stopped in ``cleanup_ctx``. Errors: every bad input raises ``ApiError`` (a 4xx with a JSON
body); anything unexpected becomes a logged JSON 500 in ``error_middleware``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from online.frontend.blas_threads import set_blas_threads
from online.frontend.thread_priority import background_executor
from online.frontend.export import Export
from online.frontend.guards import Guards, GuardedRunner
from online.frontend.http_metrics import HttpMetrics
from online.search import int8_prefilter, shared_arrays
from online.search.ivf_build import IvfMaintainer
from online.search.model_index import ModelHolder, SearchConfig, warm_up
from online.search.search_processes import SearchProcesses
from online.frontend.limits import (MAX_ANALOGY_PARAM_LENGTH, MAX_CHECKPOINT_LENGTH, MAX_PREFIX_LENGTH, MAX_SINCE,
                                    MAX_VOCAB_LIMIT, MAX_WORD_LENGTH)
from online.frontend.openapi import build_openapi
from online.frontend import query_body, vector_queries
from online.frontend.query_engine import Overloaded, QueryEngine
from online.frontend.settings import FrontendSettings
from online.frontend.sources import ModelSource, resolve_source_factory
from online.frontend.sync import ModelSync
from online.frontend.whats_new import MAX_LIMIT as MAX_HISTORY_LIMIT, RANKINGS, HistoryLookupError, WhatsNew
from ps_bridge.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ps_bridge.metrics import Registry
from ps_bridge.structured_logging import log_event
from ps_bridge.settings import SettingError

log = logging.getLogger("livevec.frontend")

STATIC_DIR = Path(__file__).with_name("static")
SETTINGS = web.AppKey("settings", FrontendSettings)
SOURCE = web.AppKey("source", object)
HOLDER = web.AppKey("holder", ModelHolder)
ENGINE = web.AppKey("engine", QueryEngine)
SYNC = web.AppKey("sync", ModelSync)
REGISTRY = web.AppKey("registry", Registry)
HTTP_METRICS = web.AppKey("http_metrics", HttpMetrics)
OPENAPI = web.AppKey("openapi", dict)
GUARDS = web.AppKey("guards", Guards)
MAINTAINER = web.AppKey("ivf_maintainer", IvfMaintainer)
WHATS_NEW = web.AppKey("whats_new", WhatsNew)
_DIGITS = re.compile(r"[0-9]{1,9}")
_NUMBER = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,3})?")


class ApiError(Exception):
    """A client error: status, machine-readable code, message and extra fields for the body."""

    def __init__(self, status: int, code: str, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), status=status,
                        content_type="application/json", headers=headers)


def error_response(status: int, code: str, message: str, headers: Mapping[str, str] | None = None,
                   **extra: Any) -> web.Response:
    return json_response({"error": code, "message": message, **extra}, status, headers)


# ---------------------------------------------------------------------- parsing
def _param_int(request: web.Request, name: str, default: int, maximum: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw) or not 1 <= int(raw) <= maximum:
        raise ApiError(400, f"bad_{name}", f"{name} must be an integer from 1 to {maximum}, got {raw[:40]!r}",
                       parameter=name)
    return int(raw)


def _param_number(request: web.Request, name: str, default: float, minimum: float, maximum: float, *,
                  exclusive: bool = False) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    value = float(raw) if _NUMBER.fullmatch(raw) else None
    if value is None or not (minimum < value if exclusive else minimum <= value) or not value <= maximum:
        bounds = f"above {minimum:g} and at most {maximum:g}" if exclusive else f"from {minimum:g} to {maximum:g}"
        raise ApiError(400, f"bad_{name}", f"{name} must be a number {bounds}, got {raw[:40]!r}", parameter=name)
    return value


def _param_word(value: str | None, name: str) -> str:
    if value is None:
        raise ApiError(400, "missing_parameter", f"the query parameter {name!r} is required", parameter=name)
    if not value:
        raise ApiError(400, f"bad_{name}", f"{name} must not be empty", parameter=name)
    if len(value) > MAX_WORD_LENGTH:
        raise ApiError(400, f"bad_{name}", f"{name} is longer than {MAX_WORD_LENGTH} characters", parameter=name)
    return value


def _param_word_list(request: web.Request, name: str, required: bool) -> list[str]:
    raw = request.query.get(name)
    if raw is None or raw == "":
        if required:
            raise ApiError(400, "missing_parameter", f"the query parameter {name!r} is required "
                                                     "(comma-separated words)", parameter=name)
        return []
    if len(raw) > MAX_ANALOGY_PARAM_LENGTH:
        raise ApiError(400, f"bad_{name}", f"{name} is longer than {MAX_ANALOGY_PARAM_LENGTH} characters",
                       parameter=name)
    words = [w.strip() for w in raw.split(",") if w.strip()]
    if required and not words:
        raise ApiError(400, f"bad_{name}", f"{name} must name at least one word", parameter=name)
    return words


def _ready_index(request: web.Request):
    holder = request.app[HOLDER]
    if not holder.loaded:
        raise ApiError(503, "not_ready", "no model has been loaded yet; try again shortly")
    return holder.current


def _neighbours(result) -> list[dict[str, Any]]:
    return [{"word": n.word, "score": n.score} for n in result.neighbours]


def _unknown(result) -> ApiError:
    words = ", ".join(repr(w) for w in result.unknown[:10])
    return ApiError(404, "unknown_word", f"not in the vocabulary (model version {result.version}): {words}",
                    unknown=result.unknown)


# --------------------------------------------------------------------- handlers
async def similar_get(request: web.Request) -> web.Response:
    word = _param_word(request.query.get("word"), "word")
    k = _param_int(request, "k", 10, request.app[SETTINGS].max_k)
    _ready_index(request)
    result = _answered(await request.app[ENGINE].query([word], [], k))
    return json_response({"word": result.resolved[0], "version": result.version, "k": k,
                          "search": result.search, "neighbours": _neighbours(result)})


async def _json_body(request: web.Request) -> dict:
    settings = request.app[SETTINGS]
    if (request.content_length or 0) > settings.max_body_bytes:   # refused before a byte of it is read
        raise ApiError(413, "body_too_large", f"the body may hold at most {settings.max_body_bytes} bytes")
    try:
        async with asyncio.timeout(settings.body_timeout):
            body = await request.read()
    except TimeoutError:
        raise ApiError(408, "body_timeout", f"the body did not arrive within {settings.body_timeout:g} s") from None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "bad_body", 'the body must be a JSON object like {"words": ["paris"], "k": 10} or '
                                        '{"positive": ["king", "woman"], "negative": ["man"]}')
    return data


async def similar_post(request: web.Request) -> web.Response:
    data = await _json_body(request)
    if "words" not in data and {"positive", "negative", "vector"} & set(data):   # "words" keeps its old meaning
        return await _term_query(request, data)
    settings = request.app[SETTINGS]
    words = data.get("words")
    if not isinstance(words, list) or not words:
        raise ApiError(400, "bad_words", '"words" must be a non-empty list of strings (or query with "positive", '
                                         '"negative" or "vector")', parameter="words")
    if len(words) > settings.max_batch_words:
        raise ApiError(400, "bad_words", f'"words" may hold at most {settings.max_batch_words} words, '
                                         f"got {len(words)}", parameter="words")
    for w in words:
        if not isinstance(w, str) or not w or len(w) > MAX_WORD_LENGTH:
            raise ApiError(400, "bad_words", f'every word must be a string of 1 to {MAX_WORD_LENGTH} '
                                             f"characters, got {str(w)[:40]!r}", parameter="words")
    k = _body(query_body.parse_k, data, settings.max_k)
    _ready_index(request)
    results = await request.app[ENGINE].query_many(words, k)
    out = []
    for word, result in zip(words, results):
        if result.unknown:
            out.append({"word": word, "version": result.version, "error": "unknown_word",
                        "message": "not in the vocabulary"})
        else:
            out.append({"word": result.resolved[0], "version": result.version, "search": result.search,
                        "neighbours": _neighbours(result)})
    return json_response({"version": results[0].version, "k": k, "results": out})


def _body(parse, *args, **kwargs):
    try:
        return parse(*args, **kwargs)
    except query_body.BodyError as exc:
        raise ApiError(400, exc.code, exc.message, parameter=exc.parameter) from None


def _answered(result):
    """The result of an engine query, or the 404/400 it deserves."""
    if result.unknown:
        raise _unknown(result)
    if result.rejected is not None:
        raise ApiError(400, result.rejected.code, str(result.rejected))
    return result


async def _term_query(request: web.Request, data: dict) -> web.Response:
    query = _body(query_body.parse_terms, data, request.app[SETTINGS].max_k, MAX_WORD_LENGTH)
    _ready_index(request)
    result = _answered(await request.app[ENGINE].query_terms(query.terms, query.k, query.kind))
    n = query.n_positive
    return json_response({"positive": result.resolved[:n], "negative": result.resolved[n:],
                          "method": query.kind, "version": result.version, "k": query.k, "search": result.search,
                          "neighbours": _neighbours(result)})


async def analogy_post(request: web.Request) -> web.Response:
    return await _term_query(request, await _json_body(request))


async def closer(request: web.Request) -> web.Response:
    word = _param_word(request.query.get("word"), "word")
    than = _param_word(request.query.get("than"), "than")
    _ready_index(request)
    terms = [vector_queries.Term(word, 1.0), vector_queries.Term(than, 1.0)]
    result = _answered(await request.app[ENGINE].query_terms(terms, 1, "closer"))
    return json_response({"word": result.resolved[0], "than": result.resolved[1], "version": result.version,
                          "count": len(result.neighbours), "words": _neighbours(result)})


async def analogy(request: web.Request) -> web.Response:
    positive = _param_word_list(request, "positive", required=True)
    negative = _param_word_list(request, "negative", required=False)
    k = _param_int(request, "k", 10, request.app[SETTINGS].max_k)
    _ready_index(request)
    result = _answered(await request.app[ENGINE].query(positive, negative, k))
    return json_response({"positive": result.resolved[:len(positive)], "negative": result.resolved[len(positive):],
                          "version": result.version, "k": k, "search": result.search,
                          "neighbours": _neighbours(result)})


async def vector(request: web.Request) -> web.Response:
    word = _param_word(request.match_info.get("word"), "word")
    index = _ready_index(request)
    row = index.row(word)
    if row < 0:
        raise ApiError(404, "unknown_word", f"not in the vocabulary (model version {index.version}): {word!r}",
                       unknown=[word])
    return json_response({"word": index.words[row], "key": str(int(index.keys[row])), "count": int(index.counts[row]),
                          "dim": index.dim, "version": index.version, "vector": index.vector(row)})


async def vocab(request: web.Request) -> web.Response:
    prefix = request.query.get("prefix", "")
    if len(prefix) > MAX_PREFIX_LENGTH:
        raise ApiError(400, "bad_prefix", f"prefix is longer than {MAX_PREFIX_LENGTH} characters",
                       parameter="prefix")
    limit = _param_int(request, "limit", 20, MAX_VOCAB_LIMIT)
    index = _ready_index(request)
    words = [{"word": w, "count": c} for w, c in index.prefix(prefix, limit)]
    return json_response({"version": index.version, "prefix": prefix, "total": index.prefix_total(prefix),
                          "words": words})


async def stats(request: web.Request) -> web.Response:
    app = request.app
    holder, sync = app[HOLDER], app[SYNC]
    index = holder.current
    source_stats = sync.source_stats

    def num(key):
        v = source_stats.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    freshness = sync.seconds_since_sync()
    return json_response({
        "ready": holder.loaded,
        "version": index.version,
        "vocab_size": index.n,
        "dim": index.dim,
        "model_time": holder.swapped_at if sync.last_change_at is None else sync.last_change_at,
        "freshness_seconds": None if freshness is None else round(freshness, 3),
        "words_trained": num("words_trained"),
        "words_per_second": num("words_per_second"),
        "kafka_lag": num("kafka_lag"),
        "records_malformed": source_stats.get("records_malformed")
        if isinstance(source_stats.get("records_malformed"), dict) else None,
        "training": source_stats.get("training") if isinstance(source_stats.get("training"), dict) else None,
        "sync": sync.report(),
        "source": source_stats,
        "queries": app[HTTP_METRICS].summary(),
        "search": {**index.describe_search(), **app[ENGINE].report(), **app[MAINTAINER].report(index)},
        "whats_new_bytes": app[WHATS_NEW].nbytes(), "whats_new_disk_bytes": app[WHATS_NEW].disk_bytes(),
        "history": list(sync.history),
    })


async def _from_history(request: web.Request, method, *args) -> web.Response:
    """Call a ``WhatsNew`` answer off the event loop; what it cannot find is a 404."""
    _ready_index(request)
    try:
        return json_response(await asyncio.to_thread(method, *args))
    except HistoryLookupError as exc:
        raise ApiError(503 if exc.code == "not_ready" else 404, exc.code, exc.message, **exc.extra) from None


async def new_words(request: web.Request) -> web.Response:
    since = _param_number(request, "since", 0.0, 0.0, MAX_SINCE)
    limit = _param_int(request, "limit", 20, MAX_HISTORY_LIMIT)
    return await _from_history(request, request.app[WHATS_NEW].new_words, since, limit)


async def rising(request: web.Request) -> web.Response:
    whats_new = request.app[WHATS_NEW]
    window = _param_number(request, "window", min(300.0, whats_new.max_window), 0.0, whats_new.max_window,
                           exclusive=True)
    limit = _param_int(request, "limit", 20, MAX_HISTORY_LIMIT)
    by = request.query.get("by", "rise")
    if by not in RANKINGS:
        raise ApiError(400, "bad_by", f"by must be one of {', '.join(RANKINGS)}, got {by[:40]!r}", parameter="by")
    return await _from_history(request, whats_new.rising, window, limit, by)


async def drift(request: web.Request) -> web.Response:
    word = _param_word(request.query.get("word"), "word")
    k = _param_int(request, "k", 10, request.app[SETTINGS].max_k)
    checkpoint = request.query.get("checkpoint", "oldest")
    if not 1 <= len(checkpoint) <= MAX_CHECKPOINT_LENGTH:
        raise ApiError(400, "bad_checkpoint", f"checkpoint must be 'oldest', 'previous' or an id (1 to "
                                              f"{MAX_CHECKPOINT_LENGTH} characters)", parameter="checkpoint")
    return await _from_history(request, request.app[WHATS_NEW].drift, word, k, checkpoint)


async def history(request: web.Request) -> web.Response:
    return json_response(await asyncio.to_thread(request.app[WHATS_NEW].history))


async def health(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    holder = request.app[HOLDER]
    if holder.loaded:
        return json_response({"ready": True, "version": holder.current.version})
    return json_response({"ready": False}, status=503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[REGISTRY].render().encode(), headers={"Content-Type": METRICS_CONTENT_TYPE})


async def openapi(request: web.Request) -> web.Response:
    """The document for the served model's dimension (a query vector must have it), built once per dimension."""
    holder, documents = request.app[HOLDER], request.app[OPENAPI]
    dim = holder.current.dim if holder.loaded else None
    if dim not in documents:
        documents[dim] = orjson.dumps(build_openapi(request.app[SETTINGS], dim))
    return web.Response(body=documents[dim], content_type="application/json")


async def page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


# ------------------------------------------------------------------- middleware
def _route_name(request: web.Request) -> str:
    route = request.match_info.route
    resource = getattr(route, "resource", None)
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    started = time.perf_counter()
    try:
        response = await handler(request)
    except ApiError as exc:
        response = error_response(exc.status, exc.code, exc.message, **exc.extra)
    except Overloaded as exc:                 # load shedding (query_engine): fast 503s instead of a queue
        response = error_response(503, "overloaded", str(exc), headers={"Retry-After": "1"}, reason=exc.reason)
    except web.HTTPException as exc:          # routing (404/405), body too large (413), ...
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        code = exc.reason.lower().replace(" ", "_") if exc.reason else "http_error"
        response = error_response(exc.status, code, exc.text or exc.reason, headers=headers)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        request.app[HTTP_METRICS].errors_500.inc()
        log.exception("unhandled error in %s %s", request.method, request.path)
        log_event(log, "internal_error", logging.ERROR, method=request.method, path=request.path, error=repr(exc))
        response = error_response(500, "internal_error", "the server failed to answer; this is a bug and was logged")
    if response.status in (408, 413):   # the rest of that body is not worth waiting for
        response.force_close()
    request.app[HTTP_METRICS].observe(_route_name(request), request.method, response.status,
                                      time.perf_counter() - started)
    return response


# ---------------------------------------------------------------------- the app
async def _background(app: web.Application):
    settings, source = app[SETTINGS], app[SOURCE]
    # every asyncio.to_thread from here on (syncs, builds, recall checks, analytics) runs below the queries
    loop, background = asyncio.get_running_loop(), background_executor(settings.background_nice)
    loop.set_default_executor(background)
    log_event(log, "background_priority", nice_steps=settings.background_nice)
    if settings.blas_threads:
        changed = await asyncio.to_thread(set_blas_threads, settings.blas_threads)
        log_event(log, "blas_threads_set", threads=settings.blas_threads, libraries=len(changed))
    await asyncio.to_thread(warm_up)        # numba: 2.5 s on a cold cache, not on the first query
    log_event(log, "similarity_search", scan=int8_prefilter.SCAN,
              note="" if int8_prefilter.SCAN == "vnni" else "no AVX-512 VNNI kernel: exact float32 search, slower")
    # The query thread re-takes the GIL after every numpy/numba call; with the default 5 ms
    # switch interval each of those waits can cost up to 5 ms while the loop parses requests.
    sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
    engine, sync = app[ENGINE], app[SYNC]
    engine.start()
    tasks = [asyncio.create_task(sync.run(), name="model-sync"),
             asyncio.create_task(sync.run_stats(), name="source-stats"),
             asyncio.create_task(app[MAINTAINER].run(), name="ivf-maintainer"),
             asyncio.create_task(app[WHATS_NEW].run(min(settings.sync_interval, settings.rising_interval,
                                                        settings.drift_interval)), name="whats-new")]
    yield
    sync.stop()
    app[MAINTAINER].stop()
    for _ in range(10):       # a cancel can be lost if it lands as an await completes: ask again
        for task in tasks:
            task.cancel()
        done, pending = await asyncio.wait(tasks, timeout=1.0)
        if not pending:
            break
        tasks = list(pending)
    await asyncio.to_thread(engine.stop)
    close = getattr(source, "close", None)
    if close is not None:
        try:
            await close()
        except Exception as exc:   # closing a broken source must not hide the shutdown
            log_event(log, "source_close_failed", logging.WARNING, error=repr(exc))
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor())    # the loop may outlive this app
    background.shutdown(wait=False)


def create_app(settings: FrontendSettings, source: ModelSource, registry: Registry | None = None) -> web.Application:
    """The application serving ``source`` with ``settings`` (already validated)."""
    registry = registry or Registry(const_labels={"role": "frontend"})
    # Long request lines are answered by our own JSON 400s (parameter limits), not by the
    # HTTP parser's plain-text 400 at its default 8 KB. aiohttp's keep-alive timer also runs from
    # the moment a connection opens and closes it if no complete request head arrived by then.
    # No lingering: an unread (oversized) body is not drained; the connection is closed instead.
    guards = Guards(registry, settings.max_concurrent_requests, settings.token(), error_response)
    app = web.Application(middlewares=[error_middleware, guards.middleware], client_max_size=settings.max_body_bytes,
                          handler_args={"max_line_size": 128 * 1024, "max_field_size": 32 * 1024,
                                        "keepalive_timeout": settings.header_timeout, "lingering_time": 0})
    app[GUARDS] = guards
    search = SearchConfig.of(settings)
    holder = ModelHolder(search)
    app[SETTINGS] = settings
    app[SOURCE] = source
    app[REGISTRY] = registry
    app[HOLDER] = holder
    app[HTTP_METRICS] = HttpMetrics(registry)
    searcher = None
    if settings.search_processes:
        shared_arrays.enable()          # before the first load: the rows the processes map are allocated shared
        searcher = SearchProcesses(settings.search_processes, registry)
    app[ENGINE] = QueryEngine(holder, settings.query_batch, registry, threaded=settings.query_thread,
                              max_wait=settings.query_max_wait, queue_limit=settings.query_queue_limit,
                              searcher=searcher)
    app[MAINTAINER] = IvfMaintainer(holder, search)
    app[SYNC] = ModelSync(source, holder, interval=settings.sync_interval, stats_interval=settings.stats_interval,
                          registry=registry, freeze=settings.gc_freeze)
    app[WHATS_NEW] = WhatsNew(holder, new_words_keep=settings.new_words_keep, rising_interval=settings.rising_interval,
                              rising_samples=settings.rising_samples, drift_interval=settings.drift_interval,
                              drift_keep=settings.drift_keep, drift_dir=settings.drift_dir or None)
    app[OPENAPI] = {None: orjson.dumps(build_openapi(settings))}
    app.cleanup_ctx.append(_background)
    app.router.add_get("/v1/similar", similar_get)
    app.router.add_post("/v1/similar", similar_post)
    app.router.add_get("/v1/analogy", analogy)
    app.router.add_post("/v1/analogy", analogy_post)
    app.router.add_get("/v1/closer", closer)
    app.router.add_get("/v1/vector/{word}", vector)
    app.router.add_get("/v1/vocab", vocab)
    app.router.add_get("/v1/export", Export(holder, error_response).handle)
    app.router.add_get("/v1/new", new_words)
    app.router.add_get("/v1/rising", rising)
    app.router.add_get("/v1/drift", drift)
    app.router.add_get("/v1/history", history)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/", page)
    app.router.add_static("/static/", STATIC_DIR, append_version=False)
    return app


def build_source(settings: FrontendSettings, env: Mapping[str, str]) -> ModelSource:
    """The source named by ``settings.source``; a missing module or bad spec is a SettingError."""
    try:
        factory = resolve_source_factory(settings.source)
    except (ImportError, AttributeError, ValueError) as exc:
        raise SettingError("LIVEVEC_MODEL_SOURCE", f"cannot load model source {settings.source!r}: {exc}") from None
    return factory(settings, env)


# -------------------------------------------------------------------------- CLI
async def serve(app: web.Application, host: str, port: int, stop: asyncio.Event | None = None, *,
                handle_signals: bool = True, shutdown_timeout=None) -> None:
    """Serve until ``stop`` (or SIGTERM/SIGINT, unless the caller handles them); ``shutdown_timeout()`` (seconds,
    asked when the stop comes) bounds the shutdown: requests in flight, the background tasks, the source's close."""
    settings = app[SETTINGS]
    runner = GuardedRunner(app, settings.max_connections, settings.max_connections_per_client,
                           app[GUARDS].refused["too_many_connections"],
                           access_log=None, handle_signals=False)
    await runner.setup()
    tls = settings.ssl_context()
    site = web.TCPSite(runner, host, port, ssl_context=tls, backlog=1024)
    try:
        await site.start()
    except OSError as exc:       # the port is taken, the address does not exist here
        await runner.cleanup()
        raise SettingError("LIVEVEC_HTTP_PORT", f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM) if handle_signals else ():
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    bound = [a for a in runner.addresses if isinstance(a, tuple)]
    shown_host = host if host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    scheme = "https" if tls else "http"
    url = f"{scheme}://{shown_host}:{bound[0][1]}/" if bound else f"{scheme}://{host}:{port}/"
    print(f"livevec frontend: serving {url}", flush=True)
    log_event(log, "frontend_listening", url=url, source=settings.source, tls=bool(tls),
              api_token=settings.token() is not None, max_connections=settings.max_connections)
    try:
        await stop.wait()
    finally:
        log_event(log, "frontend_stopping")
        bound = None if shutdown_timeout is None else max(0.1, shutdown_timeout())
        try:
            await asyncio.wait_for(runner.cleanup(), bound)
        except asyncio.TimeoutError:
            log_event(log, "frontend_shutdown_cut_short", logging.WARNING, waited_s=round(bound, 2),
                      setting="LIVEVEC_STOP_TIMEOUT")
