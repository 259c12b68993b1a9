"""deploy/Dockerfile, tested without a Docker engine (there is none on this machine).

What this proves: that the image does what it is for, checked on the parsed Dockerfile
(a slim Python base; the project, with its compiled int8 kernel, pip-installed into a venv
that the runtime stage copies and puts first on PATH; a compiler only in the build stage;
the non-root uid the Kubernetes pods run as; EXPOSE matching the ports the roles listen
on; numba's cache on a volume the read-only pods can write; COPY sources that exist and
pass the .dockerignore), and each of those checks is shown to fail on a copy broken on
purpose. Then the build and run steps are replayed in a clean venv: the files the
Dockerfile COPYs, installed with the Dockerfile's own pip arguments, give every module
and the kernel, and the ENTRYPOINT/CMD and HEALTHCHECK commands run from the installed copy
(outside the repository) and behave. What it cannot prove: that the base image pulls, that
the dependency wheels install on it (the clean venv borrows the already installed
dependencies instead of downloading them; there is no network), or the layer details of
`docker build`.
"""
from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from ps_bridge.metrics import Registry, serve_http

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


def project_install(dockerfile) -> tuple[str, list[str]]:
    """(venv prefix, pip install arguments) of the build stage's install of the project."""
    for ins, args in dockerfile[0]["steps"]:
        if ins != "RUN":
            continue
        cmds = _commands(args)
        venvs = [c for c in cmds if c[1:3] == ["-m", "venv"]]
        pips = [c for c in cmds if c and c[0].endswith("/bin/pip") and "install" in c]
        if venvs and pips:
            return venvs[0][-1], pips[0][pips[0].index("install") + 1:]
    raise AssertionError("the build stage has no RUN that creates a venv and pip-installs into it")


# ---------------------------------------------------------------- what the image must be
# Each check returns the problems it finds (empty: the Dockerfile does what it is for).
# test_each_check_catches_a_broken_dockerfile feeds each one a copy broken on purpose.

def check_base_and_entrypoint(dockerfile) -> list[str]:
    final = dockerfile[-1]
    problems = []
    arg_default = re.search(r"ARG PYTHON_VERSION=(\S+)", DOCKERFILE.read_text()).group(1)
    base = final["from"].split()[0].replace("${PYTHON_VERSION}", arg_default)
    if not re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", base):
        problems.append(f"runtime base {base} is not a slim Python >= 3.11")
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


def check_installs_the_project_into_the_runtime_venv(dockerfile) -> list[str]:
    build, final = dockerfile[0], dockerfile[-1]
    prefix, pip_args = project_install(dockerfile)
    problems = []
    targets = [a for a in pip_args if not a.startswith("-")]
    if [t.split("[")[0] for t in targets] != ["."]:
        problems.append(f"pip installs {targets}, not the project copied into the build context")
    if {"-e", "--editable"} & set(pip_args):
        problems.append("an editable install points into the build stage, which the runtime image lacks")
    copied = [shlex.split(args) for ins, args in build["steps"] if ins == "COPY"]
    if not any("pyproject.toml" in c[:-1] and c[-1] in ("./", ".") for c in copied):
        problems.append("pyproject.toml is not copied to the directory pip installs")
    wanted = [f"--from={_stage_name(build)}", prefix, prefix]
    if wanted not in [shlex.split(args) for ins, args in final["steps"] if ins == "COPY"]:
        problems.append(f"the runtime stage does not COPY {prefix} from the build stage to the same path")
    path = _final_env(final).get("PATH", "")
    if path.split(":")[0] != f"{prefix}/bin":
        problems.append(f"PATH does not start with {prefix}/bin, so `livevec` is not found by name")
    return problems


def check_compiler_only_in_the_build_stage(dockerfile) -> list[str]:
    """The int8 kernel is compiled at install time; the runtime image needs no compiler."""
    problems = []
    steps = dockerfile[0]["steps"]
    runs = [args for ins, args in steps if ins == "RUN"]
    install_at = next(i for i, args in enumerate(runs) if "pip install" in args)
    gcc_at = [i for i, args in enumerate(runs) for c in _commands(args)
              if c[:2] == ["apt-get", "install"] and "gcc" in c]
    if not gcc_at or gcc_at[0] > install_at:
        problems.append("the build stage does not install gcc before pip builds online/frontend/int8_scan.c")
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


CHECKS = [check_base_and_entrypoint, check_runs_as_the_pods_user, check_installs_the_project_into_the_runtime_venv,
          check_compiler_only_in_the_build_stage, check_exposes_the_roles_ports,
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
    (check_base_and_entrypoint, _edit(-1, "HEALTHCHECK", lambda a: re.sub(r"--start-period=\S+", "", a))),
    (check_runs_as_the_pods_user, _append(-1, "USER", "root")),
    (check_runs_as_the_pods_user, _edit(-1, "USER", lambda a: "10002:10002")),
    (check_installs_the_project_into_the_runtime_venv, _edit(0, "RUN", lambda a: a.replace(" install .", " install -e ."))),
    (check_installs_the_project_into_the_runtime_venv, _edit(0, "RUN", lambda a: a.replace(" install .", " install livevec"))),
    (check_installs_the_project_into_the_runtime_venv, _edit(-1, "COPY", lambda a: a + "-moved")),
    (check_installs_the_project_into_the_runtime_venv, _edit(-1, "ENV", lambda a: re.sub(r"PATH=\S+", "PATH=/usr/bin", a))),
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


def _build_in_clean_venv(dockerfile, tmp_path: Path) -> Path:
    """Replay the build stage: COPY into a fresh context, then its pip install of the project
    with the Dockerfile's own arguments, into a venv standing in for its prefix. pip gets
    --no-deps/--no-index/--no-build-isolation (no network); the dependencies come from the
    project venv through a .pth file."""
    build = dockerfile[0]
    context = tmp_path / "src"
    context.mkdir()
    for ins, args in build["steps"]:
        if ins == "COPY":
            *sources, dest = shlex.split(args)
            for src in sources:
                target = context / dest if dest not in ("./", ".") else context / Path(src).name
                if (REPO / src).is_dir():
                    shutil.copytree(REPO / src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
                else:
                    shutil.copy(REPO / src, target if dest not in ("./", ".") else context / src)
    _prefix, pip_args = project_install(dockerfile)
    assert shutil.which("gcc"), "this machine has no gcc, which the build stage installs in the image"
    prefix = tmp_path / "opt-livevec"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))
    (site / "project-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--disable-pip-version-check", *pip_args],
                   cwd=context, check=True, timeout=120)
    return prefix


@pytest.fixture(scope="module")
def installed(dockerfile, tmp_path_factory):
    return _build_in_clean_venv(dockerfile, tmp_path_factory.mktemp("image"))


def _image_env(prefix: Path, dockerfile, **extra) -> dict[str, str]:
    env = {"PATH": f"{prefix / 'bin'}:/usr/bin:/bin", "HOME": str(prefix), "LANG": "C.UTF-8"}
    for ins, args in dockerfile[-1]["steps"]:
        if ins == "ENV":
            for key, value in re.findall(r"(\w+)=(\S+)", args):
                if key != "PATH":
                    env[key] = value
    env.update(extra)
    return env


def test_every_module_is_installed_from_the_copied_files(installed):
    site = Path(sysconfig.get_path("purelib", vars={"base": str(installed), "platbase": str(installed)}))
    missing = []
    for package in ("online", "ps_bridge"):
        for path in (REPO / package).rglob("*.py"):
            rel = path.relative_to(REPO)
            if "__pycache__" not in rel.parts and not (site / rel).exists():
                missing.append(str(rel))
    assert missing == [], f"modules the image would lack: {missing}"


def test_the_int8_kernel_is_built_into_the_image(installed, dockerfile, tmp_path):
    env = _image_env(installed, dockerfile)
    done = subprocess.run(["python", "-c", "from online.frontend import _int8_scan, int8_prefilter; "
                           "print(_int8_scan.__file__, int8_prefilter.SCAN)"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    path, scan = done.stdout.split()
    assert path.startswith(str(installed)) and scan in ("vnni", "portable")


def test_entrypoint_and_cmd_run_from_the_installed_copy(installed, dockerfile, tmp_path):
    steps = dict(dockerfile[-1]["steps"])  # the last occurrence wins, as in Docker
    argv = _exec_form(steps["ENTRYPOINT"]) + _exec_form(steps["CMD"])
    env = _image_env(installed, dockerfile)
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "deploy" in done.stdout and "server" in done.stdout
    where = subprocess.run(["python", "-c", "import online.cli.main; print(online.cli.main.__file__)"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(installed)), where.stdout + where.stderr
    # The installed package renders exactly the committed deploy files.
    out = tmp_path / "rendered"
    subprocess.run(["livevec", "deploy", "render", "--target", "marathon", "--out", str(out)], env=env,
                   cwd=tmp_path, check=True, capture_output=True, timeout=60)
    for f in (REPO / "deploy" / "marathon").glob("*.json"):
        assert (out / f.name).read_text() == f.read_text()


def test_healthcheck_command_probes_the_role(installed, dockerfile, tmp_path):
    steps = dict(dockerfile[-1]["steps"])  # the last occurrence wins, as in Docker
    argv = _exec_form(steps["HEALTHCHECK"].split("CMD", 1)[1].strip())
    up = serve_http(Registry(), "127.0.0.1", 0)
    try:
        port = up.server_address[1]
        # A Marathon server task: the container env has PORT_METRICS, not what cmd exported.
        ok = subprocess.run(argv, env=_image_env(installed, dockerfile, DMLC_ROLE="server", PORT_METRICS=str(port)),
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert f"{port}/health -> 200" in ok.stdout
    finally:
        up.shutdown()
        up.server_close()
    down = subprocess.run(argv, env=_image_env(installed, dockerfile, LIVEVEC_METRICS_PORT=str(port)),
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert down.returncode == 1, down.stdout
    oneshot = subprocess.run(argv, env=_image_env(installed, dockerfile), cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert oneshot.returncode == 0 and "nothing to probe" in oneshot.stdout
