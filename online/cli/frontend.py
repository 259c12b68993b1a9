"""``livevec frontend``: serve similarity queries and the live page over HTTP."""
from __future__ import annotations

import argparse
import asyncio
import os

from online.frontend.app import build_source, create_app, serve
from online.frontend.settings import add_arguments, settings_from


def configure(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)


def read_settings(args: argparse.Namespace, env=None):
    return settings_from(args, os.environ if env is None else env)


def run(args: argparse.Namespace) -> int:
    settings = read_settings(args)
    source = build_source(settings, os.environ)
    app = create_app(settings, source)
    asyncio.run(serve(app, settings.host, settings.port))
    return 0
