"""``livevec frontend``: the aiohttp application that answers similarity queries live.

Layout follows aiohttp's own examples: ``create_app`` is the application factory, ``routes``
maps every URL to its handler (``handlers``, a module per resource: they only parse the request,
call the model and format the answer), ``middleware`` turns errors into JSON answers, and the
long-lived pieces (the query thread, the sync loop, the stats loop) are started and stopped in
``cleanup_ctx``. ``serve`` runs the application until it is told to stop.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import sys
from collections.abc import Mapping

import orjson
from aiohttp import web

from online.frontend.app_keys import (ENGINE, GUARDS, HOLDER, HTTP_METRICS, MAINTAINER, OPENAPI, REGISTRY, SETTINGS,
                                      SOURCE, SYNC, WHATS_NEW)
from online.frontend.blas_threads import set_blas_threads
from online.frontend.guards import Guards, GuardedRunner
from online.frontend.http_metrics import HttpMetrics
from online.frontend.middleware import error_middleware
from online.frontend.openapi import build_openapi
from online.frontend.query_engine import QueryEngine
from online.frontend.responses import error_response
from online.frontend.routes import setup_routes
from online.frontend.settings import FrontendSettings
from online.frontend.sources import ModelSource, resolve_source_factory
from online.frontend.sync import ModelSync
from online.frontend.thread_priority import background_executor
from online.frontend.whats_new import WhatsNew
from online.search import int8_prefilter, shared_arrays
from online.search.ivf_build import IvfMaintainer
from online.search.model_index import ModelHolder, SearchConfig, warm_up
from online.search.search_processes import SearchProcesses
from ps_bridge.metrics import Registry
from ps_bridge.structured_logging import log_event
from ps_bridge.settings import SettingError

__all__ = ["ENGINE", "HOLDER", "SETTINGS", "build_source", "create_app", "serve"]

log = logging.getLogger("livevec.frontend")


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
                              drift_keep=settings.drift_keep, drift_dir=settings.drift_directory())
    app[OPENAPI] = {None: orjson.dumps(build_openapi(settings))}
    app.cleanup_ctx.append(_background)
    setup_routes(app)
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
