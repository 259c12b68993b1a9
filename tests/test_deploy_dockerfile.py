"""deploy/Dockerfile, read: the static checks that need no engine.

What the image does when built and run (every module and the int8 kernel installed, no
compiler or pip cache, uid 10001, the ENTRYPOINT and the HEALTHCHECK, the read-only root)
is tested on the real image, built with podman, in tests/test_deploy_containers.py. What
stays here is what the text says and a build would not check: the base is a build argument
whose default is the official slim Python; a compiler only in the build stage; the uid the
Kubernetes pods run as; EXPOSE matching the ports the roles listen on; numba's cache on a
volume the read-only pods can write; COPY sources that exist and pass the .dockerignore.
Each check is shown to fail on a copy broken on purpose.
"""
from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "deploy" / "Dockerfile"


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    logical, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    out = []
    for line in logical:
        instruction, _, rest = line.partition(" ")
        out.append((instruction.upper(), rest.strip()))
    return out


def stages(instructions):
    result, current = [], None
    for ins, args in instructions:
        if ins == "FROM":
            current = {"from": args, "steps": []}
            result.append(current)
        elif current is not None:
            current["steps"].append((ins, args))
    return result


def _exec_form(args: str) -> list[str]:
    parsed = json.loads(args)
    assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), args
    return parsed


@pytest.fixture(scope="module")
def dockerfile():
    return stages(parse_dockerfile(DOCKERFILE.read_text()))


def _last(stage: dict, instruction: str) -> str | None:
    """The arguments of the stage's last ``instruction`` (Docker: the last one wins)."""
    found = [args for ins, args in stage["steps"] if ins == instruction]
    return found[-1] if found else None


def _commands(run_args: str) -> list[list[str]]:
    return [shlex.split(part) for part in run_args.split("&&") if part.strip()]


def _stage_name(stage: dict) -> str | None:
    parts = stage["from"].split()
    return parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None


def _final_env(stage: dict) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins, args in stage["steps"]:
        if ins == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", args))
    return env


# ---------------------------------------------------------------- what the image must be
# Each check returns the problems it finds (empty: the Dockerfile does what it is for).
# test_each_check_catches_a_broken_dockerfile feeds each one a copy broken on purpose.

def check_base_and_entrypoint(dockerfile) -> list[str]:
    final = dockerfile[-1]
    problems = []
    # The base is a build argument (make image passes a debootstrapped bookworm); users get
    # the official slim Python by default, and both stages use the same base.
    default = re.search(r"^ARG BASE_IMAGE=(\S+)", DOCKERFILE.read_text(), re.M)
    if default is None or not re.fullmatch(r"python:3\.1[1-9]-slim-bookworm", default.group(1)):
        problems.append("no ARG BASE_IMAGE defaulting to a slim bookworm Python >= 3.11")
    if [stage["from"].split()[0] for stage in dockerfile] != ["${BASE_IMAGE}"] * len(dockerfile):
        problems.append("a stage is not FROM ${BASE_IMAGE}: the venv's python3 must exist in the runtime")
    # Marathon's cmd and the Kubernetes args both expect `livevec` as the program.
    if _exec_form(_last(final, "ENTRYPOINT") or "[]") != ["livevec"]:
        problems.append("ENTRYPOINT is not [\"livevec\"]")
    health = _last(final, "HEALTHCHECK") or ""
    if "--start-period" not in health:
        problems.append("HEALTHCHECK has no --start-period: the model load would count as unhealthy")
    if "CMD" not in health or _exec_form(health.split("CMD", 1)[1].strip())[:1] != ["livevec"]:
        problems.append("HEALTHCHECK is not a livevec command")
    return problems


def check_runs_as_the_pods_user(dockerfile) -> list[str]:
    from online.deployment.k8s import RUN_AS
    final = dockerfile[-1]
    user = (_last(final, "USER") or "root").split(":")
    problems = []
    if user[0] in ("root", "0", ""):
        return ["the image runs as root"]
    if user != [str(RUN_AS)] * len(user):
        problems.append(f"USER {':'.join(user)} is not the uid:gid the Kubernetes pods run as ({RUN_AS})")
    created = [c for ins, args in final["steps"] if ins == "RUN" for c in _commands(args)
               if c and c[0] == "useradd" and "--uid" in c and c[c.index("--uid") + 1] == user[0]]
    if not created:
        problems.append(f"no RUN useradd creates uid {user[0]}, so it has no home or name")
    return problems


def check_compiler_only_in_the_build_stage(dockerfile) -> list[str]:
    """The int8 kernel is compiled at install time; the runtime image needs no compiler."""
    problems = []
    steps = dockerfile[0]["steps"]
    runs = [args for ins, args in steps if ins == "RUN"]
    install_at = next(i for i, args in enumerate(runs) if "pip install --no-deps ." in args)
    gcc_at = [i for i, args in enumerate(runs) if "apt-get install" in args and re.search(r"\bgcc\b", args)]
    if not gcc_at or gcc_at[0] > install_at:
        problems.append("the build stage does not install gcc before pip builds online/search/int8_scan.c")
    for stage in dockerfile[1:]:
        for ins, args in stage["steps"]:
            if ins == "RUN" and re.search(r"\b(gcc|g\+\+|clang|build-essential)\b", args):
                problems.append(f"the runtime stage installs a compiler: RUN {args}")
    return problems


def check_exposes_the_roles_ports(dockerfile) -> list[str]:
    from online.deployment.topology import default_topology
    exposed = {int(p.split("/")[0]) for ins, args in dockerfile[-1]["steps"] if ins == "EXPOSE"
               for p in args.split()}
    listened = {p.container_port for role in default_topology().roles for p in role.ports}
    if exposed != listened:
        return [f"EXPOSE {sorted(exposed)} but the roles listen on {sorted(listened)}"]
    return []


def check_writable_paths_are_mounted_on_kubernetes(dockerfile) -> list[str]:
    """Pods run with a read-only root file system: a cache the image points at must be on a volume."""
    from online.deployment.k8s import render_objects
    from online.deployment.topology import default_topology
    env = _final_env(dockerfile[-1])
    problems = []
    for obj in render_objects(default_topology()):
        spec = obj.get("spec", {})
        template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template")
        for container in (template or {}).get("spec", {}).get("containers", []):
            writable = [m["mountPath"] for m in container.get("volumeMounts", []) if not m.get("readOnly")]
            for var in ("NUMBA_CACHE_DIR",):
                path = env.get(var)
                if path is None:
                    problems.append(f"the image sets no {var}; numba would write next to the installed code")
                elif not any(path == m or path.startswith(m.rstrip("/") + "/") for m in writable):
                    problems.append(f"{var}={path} is on the read-only root of {obj['kind']} {container['name']}")
    return problems


def check_copy_sources_exist_and_survive_the_dockerignore(dockerfile) -> list[str]:
    ignore = (REPO / "deploy" / "Dockerfile.dockerignore").read_text().split()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    problems = []
    for stage in dockerfile:
        for ins, args in stage["steps"]:
            if ins != "COPY" or args.startswith("--from"):
                continue
            *sources, _dest = shlex.split(args)
            for src in sources:
                if not (REPO / src).exists():
                    problems.append(f"COPY {src}: not in the repository")
                elif src.rstrip("/") not in allowed:
                    problems.append(f"COPY {src} is excluded by Dockerfile.dockerignore")
    return problems


CHECKS = [check_base_and_entrypoint, check_runs_as_the_pods_user, check_compiler_only_in_the_build_stage, check_exposes_the_roles_ports,
          check_writable_paths_are_mounted_on_kubernetes, check_copy_sources_exist_and_survive_the_dockerignore]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_the_dockerfile_does_what_it_is_for(dockerfile, check):
    assert check(dockerfile) == []


def _edit(stage: int, instruction: str, change):
    """A breakage: ``change(args)`` applied to every ``instruction`` of stage ``stage`` (-1: the runtime)."""
    def apply(dockerfile):
        broken = copy.deepcopy(dockerfile)
        steps = broken[stage]["steps"]
        hits = [i for i, (ins, _) in enumerate(steps) if ins == instruction]
        assert hits, f"stage {stage} has no {instruction} to break"
        for i in hits:
            steps[i] = (instruction, change(steps[i][1]))
        return broken
    return apply


def _append(stage: int, instruction: str, args: str):
    def apply(dockerfile):
        broken = copy.deepcopy(dockerfile)
        broken[stage]["steps"].append((instruction, args))
        return broken
    return apply


BREAKAGES = [
    (check_base_and_entrypoint, _edit(-1, "ENTRYPOINT", lambda a: '["python"]')),
    (check_base_and_entrypoint, lambda d: [{**d[0], "from": "debian:bookworm AS build"}, *d[1:]]),
    (check_base_and_entrypoint, _edit(-1, "HEALTHCHECK", lambda a: re.sub(r"--start-period=\S+", "", a))),
    (check_runs_as_the_pods_user, _append(-1, "USER", "root")),
    (check_runs_as_the_pods_user, _edit(-1, "USER", lambda a: "10002:10002")),
    (check_compiler_only_in_the_build_stage, _edit(0, "RUN", lambda a: re.sub(r"\bgcc\b", "", a))),
    (check_compiler_only_in_the_build_stage, _append(-1, "RUN", "apt-get install -y gcc")),
    (check_exposes_the_roles_ports, _edit(-1, "EXPOSE", lambda a: " ".join(a.split()[:-1]))),
    (check_exposes_the_roles_ports, _edit(-1, "EXPOSE", lambda a: a + " 7000")),
    (check_writable_paths_are_mounted_on_kubernetes,
     _edit(-1, "ENV", lambda a: re.sub(r"NUMBA_CACHE_DIR=\S+", "NUMBA_CACHE_DIR=/home/livevec/.numba", a))),
    (check_copy_sources_exist_and_survive_the_dockerignore, _append(0, "COPY", "no-such-dir ./no-such-dir")),
    (check_copy_sources_exist_and_survive_the_dockerignore, _append(0, "COPY", "tests ./tests")),
]


@pytest.mark.parametrize("check,breakage", BREAKAGES,
                         ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(BREAKAGES)])
def test_each_check_catches_a_broken_dockerfile(dockerfile, check, breakage):
    assert check(breakage(dockerfile)) != []
