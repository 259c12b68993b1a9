"""``livevec frontend``: serve similarity queries and the live page over HTTP.

SIGTERM (or SIGINT) stops it within ``LIVEVEC_STOP_TIMEOUT`` (``online.cluster.stopping``): requests in flight
and the model source's close (leaving the cluster) get what is left of it."""
from __future__ import annotations

import argparse
import asyncio
import os
import signal

from online.cluster.stopping import STOP_TIMEOUT, STOPPING, StopDeadline
from online.frontend.allocator import give_freed_memory_back
from online.frontend.app import build_source, create_app, serve
from online.frontend.settings import add_arguments, settings_from
from online.learner import kernel_cache


def configure(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)
    STOPPING.add_arguments(parser)


def read_settings(args: argparse.Namespace, env=None):
    env = os.environ if env is None else env
    return settings_from(args, env), StopDeadline(STOP_TIMEOUT.read(args, env), "frontend")


def run(args: argparse.Namespace) -> int:
    settings, deadline = read_settings(args)
    kernel_cache.prepare("frontend")   # the image's compiled search kernels, for it and its search processes
    give_freed_memory_back()           # before any thread starts (a sync's temporaries: see the module)
    source = build_source(settings, os.environ)
    app = create_app(settings, source)
    asyncio.run(_serve(app, settings, deadline))
    return 0


async def _serve(app, settings, deadline: StopDeadline) -> None:
    stop = asyncio.Event()

    def _stop() -> None:
        deadline.arm()
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _stop)
    await serve(app, settings.host, settings.port, stop, handle_signals=False,
                shutdown_timeout=lambda: deadline.remaining(reserve=1.0))
