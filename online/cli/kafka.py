"""``livevec kafka start|stop|status|fetch``: a local single-node KRaft broker as a daemon.

The broker itself (``online.stream.kafka_broker``) knows nothing of daemons; this command
records the daemon's pid, ports and data directory in a state file, so ``status`` and
``stop`` find it from another shell.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from online.stream.kafka_broker import KafkaBroker, KafkaBrokerError, is_our_broker, fetch_jars, probe, \
    read_state, stop_daemon
from online.stream.settings import BROKER, KafkaBrokerSettings
from ps_bridge.structured_logging import log_event

logger = logging.getLogger("livevec.kafka")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "stop", "status", "fetch"),
                        help="start: daemonise a broker and print its bootstrap address; stop; status; "
                             "fetch: only resolve the jars")
    BROKER.add_arguments(parser)


def read_settings(args: argparse.Namespace, env=None) -> KafkaBrokerSettings:
    return KafkaBrokerSettings.from_args(args, env)


def run(args: argparse.Namespace) -> int:
    settings = read_settings(args)
    state_path = settings.resolved_state_file
    try:
        if args.action == "fetch":
            jars = fetch_jars(settings)
            print(f"{settings.jars_dir} ({len(jars)} jars, Kafka {settings.version})")
            return 0
        state = read_state(state_path)
        running = bool(state) and is_our_broker(int(state["pid"]), state["data_dir"])
        if args.action == "status":
            if running and probe(state["bootstrap"], timeout=5.0):
                sasl_ssl = f" sasl_ssl={state['sasl_ssl_bootstrap']}" if state.get("sasl_ssl_bootstrap") else ""
                print(f"running {state['bootstrap']}{sasl_ssl} pid={state['pid']} version={state['version']} "
                      f"data_dir={state['data_dir']}")
                return 0
            print("running but not answering" if running else "not running")
            return 1
        if args.action == "stop":
            if not state:
                print("not running")
                return 0
            stop_daemon(state)
            state_path.unlink(missing_ok=True)
            print(f"stopped {state['bootstrap']}")
            return 0
        # start
        if running:
            log_event(logger, "kafka_broker_already_running", bootstrap=state["bootstrap"], pid=state["pid"])
            print(state["bootstrap"])
            return 0
        broker = KafkaBroker(settings, die_with_parent=False)
        broker.start()
        state = broker.detach()
        state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(state_path)
        print(state["bootstrap"], flush=True)   # stdout: the plaintext address alone, for scripts
        if state.get("sasl_ssl_bootstrap"):
            print(f"livevec kafka start: SASL_SSL listener on {state['sasl_ssl_bootstrap']}", file=sys.stderr)
        return 0
    except KafkaBrokerError as exc:
        print(f"livevec kafka {args.action}: {exc}", file=sys.stderr)
        return 1
