"""Every URL of the front end and the handler that answers it (``handlers``)."""
from __future__ import annotations

from aiohttp import web

from online.frontend.app_keys import HOLDER
from online.frontend.export import Export
from online.frontend.handlers import documents, history, queries, status, words
from online.frontend.responses import error_response


def setup_routes(app: web.Application) -> None:
    app.router.add_get("/v1/similar", queries.similar_get)
    app.router.add_post("/v1/similar", queries.similar_post)
    app.router.add_get("/v1/analogy", queries.analogy)
    app.router.add_post("/v1/analogy", queries.analogy_post)
    app.router.add_get("/v1/closer", queries.closer)
    app.router.add_get("/v1/vector/{word}", words.vector)
    app.router.add_get("/v1/vocab", words.vocab)
    app.router.add_get("/v1/export", Export(app[HOLDER], error_response).handle)
    app.router.add_get("/v1/new", history.new_words)
    app.router.add_get("/v1/rising", history.rising)
    app.router.add_get("/v1/drift", history.drift)
    app.router.add_get("/v1/history", history.history)
    app.router.add_get("/v1/stats", status.stats)
    app.router.add_get("/health", status.health)
    app.router.add_get("/ready", status.ready)
    app.router.add_get("/metrics", status.metrics)
    app.router.add_get("/openapi.json", documents.openapi)
    app.router.add_get("/", documents.page)
    app.router.add_static("/static/", documents.STATIC_DIR, append_version=False)
