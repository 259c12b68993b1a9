"""``/v1/stats``, ``/health``, ``/ready`` and ``/metrics``: how the front end and its model are doing."""
from __future__ import annotations

from aiohttp import web

from online.frontend.app_keys import ENGINE, HOLDER, HTTP_METRICS, MAINTAINER, REGISTRY, SYNC, WHATS_NEW
from online.frontend.responses import json_response
from ps_bridge.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE


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


async def health(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    holder = request.app[HOLDER]
    if holder.loaded:
        return json_response({"ready": True, "version": holder.current.version})
    return json_response({"ready": False}, status=503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[REGISTRY].render().encode(), headers={"Content-Type": METRICS_CONTENT_TYPE})
