"""``livevec deploy``: render the deployment files from the topology, check them, or run
the Marathon group on this machine.

    livevec deploy render --target marathon|k8s [--out DIR] [--servers N] [--workers M] [--workers-per-pod P] ...
    livevec deploy check  [--target marathon|k8s]     # the platform rules no schema expresses
    livevec deploy run-local [--group FILE] [--servers N] [--workers M] [--env K=V] ...
                             [--containers IMAGE]     # each task a container of IMAGE (podman)
    livevec deploy image [--tag T] [--engine auto|podman|docker] [--base auto|debootstrap|default|IMAGE]
    livevec deploy healthcheck                        # the container image's HEALTHCHECK
    livevec deploy kernels                            # compile the kernels into NUMBA_CACHE_DIR (image build)
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from online import __version__
from ps_bridge.settings import SettingError


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    def topology_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--servers", type=int, default=2, help="parameter server instances (= DMLC_NUM_SERVER)")
        p.add_argument("--workers", type=int, default=2,
                       help="worker processes (= DMLC_NUM_WORKER; on Kubernetes rounded up to whole pods)")
        p.add_argument("--workers-per-pod", type=int, default=2,
                       help="Kubernetes: worker containers per pod, which share one replica in the pod's memory "
                            "(LIVEVEC_HOST_REPLICA); the autoscaler scales pods")
        p.add_argument("--frontends", type=int, default=2, help="front-end replicas")
        p.add_argument("--image", default=f"livevec:{__version__}", help="container image (default: this release's)")
        p.add_argument("--kafka-bootstrap", default=None,
                       help="Kafka bootstrap for the rendered target (default: a placeholder per platform)")
        p.add_argument("--secure", default="", metavar="curve,token,tls|all",
                       help="also mount these secrets and point the settings at them: curve (the CurveZMQ keys of "
                            "every ps node), token (the front end's API token), tls (its certificate and key; its "
                            "probes use HTTPS); see docs/operations.md#security")
        p.add_argument("--kafka-partitions", type=int, default=8,
                       help="partitions of the topic: the workers' autoscaling ceiling")

    render = sub.add_parser("render", help="write the Marathon or Kubernetes files generated from the topology")
    render.add_argument("--target", choices=("marathon", "k8s"), required=True)
    render.add_argument("--out", type=Path, default=None,
                        help="directory to write the files into (default: stdout; for marathon one JSON "
                             "object keyed by file name)")
    topology_flags(render)

    check = sub.add_parser("check", help="check rendered files against the platform rules no schema expresses")
    check.add_argument("--target", choices=("marathon", "k8s", "all"), default="all")
    check.add_argument("--dir", type=Path, default=None,
                       help="check the files in this directory instead of a fresh rendering")
    topology_flags(check)

    run_local = sub.add_parser("run-local", help="run a Marathon group on this machine (Marathon-like)")
    run_local.add_argument("--group", type=Path, default=None,
                           help="Marathon group JSON (default: render the topology)")
    run_local.add_argument("--work-dir", type=Path, default=Path("livevec-local"),
                           help="logs, sandboxes and mapped volumes go here")
    run_local.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                           help="override an env var in every app (repeatable)")
    run_local.add_argument("--app-env", action="append", default=[], metavar="APP:KEY=VALUE",
                           help="override an env var in one app (repeatable)")
    run_local.add_argument("--instances", action="append", default=[], metavar="APP=N",
                           help="instance count of an app; DMLC_NUM_* follow (repeatable)")
    run_local.add_argument("--status-every", type=float, default=30.0, help="seconds between status tables")
    run_local.add_argument("--containers", metavar="IMAGE", default=None,
                           help="run each task as a container of IMAGE (podman, host networking, uid 10001, "
                                "read-only root) instead of as a process; build it with `make image`")
    run_local.add_argument("--storage", choices=("auto", "moosefs", "local"), default=None,
                           help="where the group's /mnt/mfs volumes live: moosefs (a MooseFS master and "
                                "chunkserver started here and mounted on this machine, as on the seed's agents; "
                                "stops if it cannot run), local (a directory under --work-dir) or auto (MooseFS "
                                "when it can run, else local, said once). Default: auto with --containers, "
                                "local without")
    topology_flags(run_local)

    image = sub.add_parser("image", help="build deploy/Dockerfile (docker with a daemon, else podman from a "
                                         "debootstrapped Debian base); prints the tag, size and build time")
    image.add_argument("--tag", default=f"livevec:{__version__}", help="the image's tag (default: this release's)")
    image.add_argument("--engine", choices=("auto", "podman", "docker"), default="auto",
                       help="auto: docker when its daemon answers, else podman")
    image.add_argument("--base", default="auto", metavar="auto|debootstrap|default|IMAGE",
                       help="the base image: debootstrap (podman's default), default (the Dockerfile's "
                            "python:3.11-slim-bookworm, docker's default) or an image reference")
    image.add_argument("--force", action="store_true", help="build even when the inputs are unchanged")

    sub.add_parser("healthcheck", help="probe this container's role (the image's HEALTHCHECK); exit 0 if healthy")
    sub.add_parser("kernels", help="compile the roles' numba kernels into NUMBA_CACHE_DIR: the image's kernel cache, "
                                   "made when it is built (online/cli/kernel_warm.py)")


def _topology(args):
    from online.deployment.topology import default_topology

    kwargs = {}
    if args.kafka_bootstrap:
        kwargs = {"kafka_bootstrap": args.kafka_bootstrap, "k8s_kafka_bootstrap": args.kafka_bootstrap}
    for flag in ("servers", "workers", "frontends", "kafka_partitions", "workers_per_pod"):
        if getattr(args, flag) < (1 if flag in ("servers", "kafka_partitions", "workers_per_pod") else 0):
            raise SettingError(f"--{flag.replace('_', '-')}", f"must be positive, got {getattr(args, flag)}")
    from online.deployment.secrets import parse_secure

    try:
        secure = parse_secure(args.secure)
    except ValueError as exc:
        raise SettingError("--secure", str(exc)) from None
    try:
        topology = default_topology(servers=args.servers, workers=args.workers, frontends=args.frontends,
                                    image=args.image, kafka_partitions=args.kafka_partitions,
                                    workers_per_pod=args.workers_per_pod, **kwargs)
    except ValueError as exc:   # the only count the topology itself refuses
        raise SettingError("--workers-per-pod", str(exc)) from None
    return topology.with_secure(secure)


def _render_files(target: str, topology) -> dict[str, str]:
    if target == "marathon":
        from online.deployment import marathon
        return marathon.render_files(topology)
    from online.deployment import k8s
    return k8s.render_files(topology)


def _key_value(text: str, flag: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SettingError(flag, f"expected KEY=VALUE, got {text!r}")
    return key, value


def run(args) -> int:
    if args.action == "render":
        files = _render_files(args.target, _topology(args))
        if args.out is None:
            if args.target == "marathon":  # one JSON document: {file name: content}, for jq
                sys.stdout.write(json.dumps({name: json.loads(text) for name, text in files.items()}, indent=2) + "\n")
            for name, text in files.items() if args.target == "k8s" else ():
                sys.stdout.write(f"# --- {name}\n{text}")
            return 0
        args.out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (args.out / name).write_text(text)
            print(args.out / name)
        return 0
    if args.action == "check":
        return _check(args)
    if args.action == "image":
        return _image(args)
    if args.action == "kernels":
        from online.cli import kernel_warm
        return kernel_warm.run(args)
    if args.action == "healthcheck":
        import os

        from online.deployment.healthcheck import check

        ok, message = check(os.environ)
        print(message)
        return 0 if ok else 1
    return _run_local(args)


def _image(args) -> int:
    from online.deployment.image_build import ImageBuildError, build_image, detect_engine

    try:
        result = build_image(args.tag, engine=detect_engine(args.engine), base=args.base, force=args.force,
                             say=lambda line: print(line, flush=True))
    except ImageBuildError as exc:
        print(f"livevec deploy image: {exc}", file=sys.stderr)
        return 1
    print(result.summary(), flush=True)
    return 0


def _check(args) -> int:
    from online.deployment import platform_rules

    problems: list[str] = []
    targets = ("marathon", "k8s") if args.target == "all" else (args.target,)
    for target in targets:
        files = _render_files(target, _topology(args))
        if args.dir is not None:
            files = {name: (args.dir / name).read_text() for name in files if (args.dir / name).exists()}
        problems += platform_rules.check_files(target, files)
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


def _run_local(args) -> int:
    from online.deployment.local_runner import LocalRunner, describe

    env = dict(_key_value(e, "--env") for e in args.env)
    app_env: dict[str, dict[str, str]] = {}
    for item in args.app_env:
        app, sep, kv = item.partition(":")
        if not sep:
            raise SettingError("--app-env", f"expected APP:KEY=VALUE, got {item!r}")
        key, value = _key_value(kv, "--app-env")
        app_env.setdefault(app, {})[key] = value
    instances = {}
    for item in args.instances:
        app, value = _key_value(item, "--instances")
        try:
            instances[app] = int(value)
        except ValueError:
            raise SettingError("--instances", f"{app}: expected an integer, got {value!r}") from None
    storage = args.storage or ("auto" if args.containers else "local")
    if storage != "local":
        from online.deployment.moosefs_lab import moosefs_support_problem
        problem = moosefs_support_problem()
        if problem and storage == "moosefs":
            raise SettingError("--storage", f"{problem}; nothing was started")
        if problem:
            print(f"livevec deploy run-local: no MooseFS ({problem}); the volumes are directories under "
                  f"{args.work_dir}", file=sys.stderr, flush=True)
            storage = "local"
    if args.group is not None:
        group = json.loads(args.group.read_text())
    else:
        from online.deployment.marathon import render_group
        group = render_group(_topology(args))
    mfs = None
    if storage != "local":
        from online.deployment.moosefs_lab import MachineMooseFS
        mfs = MachineMooseFS(args.work_dir.resolve()).start()
        print(f"livevec deploy run-local: MooseFS mounted at {mfs.fs.admin_path} (the group's /mnt/mfs)",
              file=sys.stderr, flush=True)
    try:
        runner = LocalRunner(group, work_dir=args.work_dir, env=env, app_env=app_env, instances=instances,
                             containers=args.containers, volumes=mfs.volumes() if mfs else None)
    except (KeyError, ValueError) as exc:
        if mfs is not None:
            mfs.close()
        raise SettingError("--group", str(exc)) from None

    def interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        runner.start()
        print(describe(runner.status()), flush=True)
        while True:
            time.sleep(args.status_every)
            print(describe(runner.status()), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        # A second Ctrl-C must not cut the clean shutdown short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        runner.stop()
        if mfs is not None:
            mfs.close()
    print(describe(runner.status()), flush=True)
    return 0
