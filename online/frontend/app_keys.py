"""What the application holds for its handlers: one typed ``web.AppKey`` per long-lived object, set by
``app.create_app`` and read as ``request.app[HOLDER]``."""
from __future__ import annotations

from aiohttp import web

from online.frontend.guards import Guards
from online.frontend.http_metrics import HttpMetrics
from online.frontend.query_engine import QueryEngine
from online.frontend.settings import FrontendSettings
from online.frontend.sync import ModelSync
from online.frontend.whats_new import WhatsNew
from online.search.ivf_build import IvfMaintainer
from online.search.model_index import ModelHolder
from ps_bridge.metrics import Registry

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
