"""deploy/Dockerfile, tested without a Docker engine (there is none on this machine).

What this proves: the image's shape (slim base, non-root user, `livevec` entrypoint, a
HEALTHCHECK that is a livevec command), and that its build and run steps work in a clean
venv: the files the Dockerfile COPYs are enough to `pip install .` the project, every
module of the packages is shipped, and the ENTRYPOINT/CMD and HEALTHCHECK commands run from
the installed copy (outside the repository) and behave. What it cannot prove: that the base
image pulls, that the dependency wheels install on it (the clean venv borrows the already
installed dependencies instead of downloading them; there is no network), or the layer
details of `docker build`.
"""
from __future__ import annotations

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


def test_image_shape(dockerfile):
    final = dockerfile[-1]
    arg_default = re.search(r"ARG PYTHON_VERSION=(\S+)", DOCKERFILE.read_text()).group(1)
    base = final["from"].replace("${PYTHON_VERSION}", arg_default)
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", base), base
    steps = dict(final["steps"][::-1])  # last occurrence wins, as in Docker
    user = steps["USER"].split(":")[0]
    assert user not in ("root", "0") and user, "the image must not run as root"
    assert _exec_form(steps["ENTRYPOINT"]) == ["livevec"]
    health = steps["HEALTHCHECK"]
    assert "--start-period" in health, "the model load must not count as unhealthy"
    assert _exec_form(health.split("CMD", 1)[1].strip())[0] == "livevec"
    # The non-root uid is the one the Kubernetes pods run as.
    from online.deployment.k8s import RUN_AS
    assert str(RUN_AS) in steps["USER"]


def test_copy_sources_exist_and_survive_the_dockerignore(dockerfile):
    ignore = (REPO / "deploy" / "Dockerfile.dockerignore").read_text().split()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for stage in dockerfile:
        for ins, args in stage["steps"]:
            if ins != "COPY" or args.startswith("--from"):
                continue
            *sources, _dest = shlex.split(args)
            for src in sources:
                assert (REPO / src).exists(), f"COPY {src}: not in the repository"
                assert src.rstrip("/") in allowed, f"COPY {src} is excluded by Dockerfile.dockerignore"


def _build_in_clean_venv(dockerfile, tmp_path: Path) -> Path:
    """Replay the build stage: COPY into a fresh context, then its RUN with /opt/livevec
    mapped into tmp_path. pip gets --no-deps/--no-index/--no-build-isolation (no network);
    the dependencies come from the project venv through a .pth file."""
    build = dockerfile[0]
    context = tmp_path / "src"
    context.mkdir()
    runs = []
    for ins, args in build["steps"]:
        if ins == "COPY":
            *sources, dest = shlex.split(args)
            for src in sources:
                target = context / dest if dest not in ("./", ".") else context / Path(src).name
                if (REPO / src).is_dir():
                    shutil.copytree(REPO / src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
                else:
                    shutil.copy(REPO / src, target if dest not in ("./", ".") else context / src)
        elif ins == "RUN":
            runs.append(args)
    assert runs == ["apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev "
                    "&& rm -rf /var/lib/apt/lists/*",
                    "python -m venv /opt/livevec && /opt/livevec/bin/pip install ."], \
        "the build RUN changed: update this replay to match it"
    assert shutil.which("gcc"), "this machine has no gcc, which the first RUN installs in the image"
    prefix = tmp_path / "opt-livevec"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))
    (site / "project-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--disable-pip-version-check", "."],
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
    done = subprocess.run(["python", "-c", "from online.frontend import _int8_scan, model_index; "
                           "print(_int8_scan.__file__, model_index.SCAN)"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    path, scan = done.stdout.split()
    assert path.startswith(str(installed)) and scan in ("vnni", "portable")


def test_entrypoint_and_cmd_run_from_the_installed_copy(installed, dockerfile, tmp_path):
    steps = dict(dockerfile[-1]["steps"][::-1])
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
    steps = dict(dockerfile[-1]["steps"][::-1])
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
