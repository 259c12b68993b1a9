"""Building the container image of deploy/Dockerfile on this machine: ``make image``.

With a Docker daemon, it is the documented ``docker build -f deploy/Dockerfile .`` (the
Dockerfile's default base, ``python:3.11-slim-bookworm``). Without one, podman builds the
same Dockerfile from a Debian bookworm base made from Debian's own packages, since no image
registry may be reachable:

- the base is ``debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates
  bookworm`` against the archive apt is configured with, imported with ``podman import``.
  Its tag carries a hash of those inputs (and of debootstrap's version), so it is made once
  and reused until one of them changes;
- the image is labelled with a hash of everything the build reads (the Dockerfile, the
  files it COPYs, the base's id); when the tagged image already has that label the build is
  skipped, and otherwise podman's layer cache still reuses the dependency layer when only
  the code changed;
- podman on this kind of host needs ``--runtime runc --cgroup-manager cgroupfs`` (crun
  refuses the hybrid cgroup layout), explicit ulimits at or below the session's own and
  host networking; the host's CA bundle is mounted over the build's, and pip is pointed at
  it, so TLS to the package archives verifies (a TLS-inspecting proxy signs with it).

Container engines are driven through their command-line clients; ``ENGINE_FLAGS`` and
``RUN_FLAGS`` are shared with the local runner's container mode.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from online import __version__

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = Path("deploy/Dockerfile")
IGNOREFILE = Path("deploy/Dockerfile.dockerignore")
DEFAULT_TAG = f"livevec:{__version__}"   # the release's image
BASE_REPOSITORY = "localhost/livevec-base"
INPUTS_LABEL = "org.livevec.build-inputs"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# podman on a hybrid-cgroup host without systemd (see the module docstring).
PODMAN_GLOBAL = ("--runtime", "runc", "--cgroup-manager", "cgroupfs")
RUN_FLAGS = ("--ulimit", "nofile=16384:16384", "--ulimit", "nproc=8192:8192", "--network", "host")
APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
DEFAULT_MIRROR = "http://deb.debian.org/debian"


class ImageBuildError(RuntimeError):
    """A build step failed; the message says which and how to fix it."""


@dataclass(frozen=True)
class Engine:
    """A container engine's client: ``argv("build", ...)`` is the command line to run."""

    name: str  # "podman" | "docker"
    prefix: tuple[str, ...]

    def argv(self, *args: str) -> list[str]:
        return [*self.prefix, *args]

    def run(self, *args: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise ImageBuildError(f"{' '.join(self.argv(*args)[:4])} ...: {done.stderr.strip()[-2000:]}")
        return done

    def image_exists(self, ref: str) -> bool:
        return self.run("image", "inspect", ref, check=False).returncode == 0

    def inspect(self, ref: str, fmt: str) -> str:
        return self.run("image", "inspect", "--format", fmt, ref).stdout.strip()


def podman() -> Engine:
    if not shutil.which("podman"):
        raise ImageBuildError("podman is not installed: `make container-tools` (apt-get install podman runc "
                              "debootstrap) installs it")
    return Engine("podman", ("podman", *PODMAN_GLOBAL))


def docker_daemon_running() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=15).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def detect_engine(choice: str = "auto") -> Engine:
    """docker when a daemon answers (or asked for), else podman."""
    if choice == "docker" or (choice == "auto" and docker_daemon_running()):
        return Engine("docker", ("docker",))
    return podman()


# ------------------------------------------------------------------------------ the base
@dataclass(frozen=True)
class DebianBase:
    suite: str = "bookworm"
    variant: str = "minbase"
    include: tuple[str, ...] = ("python3", "python3-venv", "ca-certificates")
    mirror: str = DEFAULT_MIRROR

    def inputs(self) -> dict:
        version = subprocess.run(["debootstrap", "--version"], capture_output=True, text=True).stdout.strip() \
            if shutil.which("debootstrap") else "absent"
        return {"suite": self.suite, "variant": self.variant, "include": list(self.include),
                "mirror": self.mirror, "debootstrap": version}

    @property
    def tag(self) -> str:
        digest = hashlib.sha256(json.dumps(self.inputs(), sort_keys=True).encode()).hexdigest()[:12]
        return f"{BASE_REPOSITORY}:{self.suite}-{digest}"


def apt_mirror(sources: Iterable[Path] = APT_SOURCES, suite: str = "bookworm") -> str:
    """The Debian archive apt is configured with (deb822 or one-line format)."""
    for path in sources:
        if not path.exists():
            continue
        text = path.read_text()
        for stanza in text.split("\n\n"):
            fields = dict(line.split(":", 1) for line in stanza.splitlines()
                          if ":" in line and not line.startswith(("#", " ")))
            suites = fields.get("Suites", "").split()
            uri = fields.get("URIs", "").split()
            if suite in suites and uri and "security" not in uri[0]:
                return uri[0]
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb":
                uri, dist = (parts[2], parts[3]) if parts[1].startswith("[") and len(parts) > 3 else parts[1:3]
                if dist == suite:
                    return uri
    return DEFAULT_MIRROR


def ensure_base(engine: Engine, base: DebianBase | None = None,
                say: Callable[[str], None] = print) -> tuple[str, bool]:
    """(tag, made now): the debootstrapped base, made once per set of inputs."""
    base = base or DebianBase(mirror=apt_mirror())
    tag = base.tag
    if engine.image_exists(tag):
        return tag, False
    if not shutil.which("debootstrap"):
        raise ImageBuildError("debootstrap is not installed: `make container-tools` installs it")
    t0 = time.monotonic()
    say(f"making the base {tag}: debootstrap --variant={base.variant} "
        f"--include={','.join(base.include)} {base.suite} ({base.mirror})")
    with tempfile.TemporaryDirectory(prefix="livevec-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        done = subprocess.run(["debootstrap", f"--variant={base.variant}", f"--include={','.join(base.include)}",
                               base.suite, str(rootfs), base.mirror], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise ImageBuildError(f"debootstrap failed: {(done.stdout + done.stderr)[-2000:]}")
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / cache).glob("*"):
                if item.is_file():
                    item.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(engine.argv("import", "--change", "CMD [\"/bin/bash\"]", "-", tag),
                                  stdin=tar.stdout, capture_output=True, text=True, timeout=600)
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise ImageBuildError(f"podman import failed: {imported.stderr[-2000:]}")
    say(f"base {tag} made in {time.monotonic() - t0:.1f} s")
    return tag, True


# ----------------------------------------------------------------------------- the image
def context_files(repo: Path = REPO) -> list[Path]:
    """What the build context holds after the .dockerignore: the allow-listed paths, less
    the excluded patterns (the ignore file is an allow-list: ``*`` then ``!path``)."""
    lines = [ln.strip() for ln in (repo / IGNOREFILE).read_text().splitlines() if ln.strip() and ln[0] != "#"]
    allowed = [ln[1:].rstrip("/") for ln in lines if ln.startswith("!")]
    excluded = [ln.removeprefix("**/") for ln in lines if not ln.startswith("!") and ln != "*"]
    files = []
    for name in allowed:
        root = repo / name
        for path in ([root] if root.is_file() else sorted(root.rglob("*"))):
            if path.is_file() and not any(path.match(p) or p in path.relative_to(repo).parts for p in excluded):
                files.append(path)
    return files


def inputs_digest(base_ref: str, base_id: str, repo: Path = REPO) -> str:
    h = hashlib.sha256()
    for path in [repo / DOCKERFILE, repo / IGNOREFILE, *context_files(repo)]:
        h.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(f"{base_ref}\0{base_id}".encode())
    return h.hexdigest()[:16]


@dataclass
class BuildResult:
    tag: str
    engine: str
    base: str
    size_bytes: int
    seconds: float
    base_seconds: float
    cached: bool

    def summary(self) -> str:
        how = "cached (inputs unchanged)" if self.cached else "built"
        return (f"image {self.tag}: {self.size_bytes / 1e6:.1f} MB, {how} in {self.seconds:.1f} s "
                f"({self.engine}, base {self.base}" + (f", base made in {self.base_seconds:.1f} s" if
                                                        self.base_seconds else "") + ")")


def build_image(tag: str = DEFAULT_TAG, *, engine: Engine | None = None, base: str = "auto",
                repo: Path = REPO, force: bool = False, say: Callable[[str], None] = print) -> BuildResult:
    """Build deploy/Dockerfile as ``tag``, unless the tagged image was built from the same inputs.

    ``base``: "auto" (debootstrap on podman, the Dockerfile's default on docker),
    "debootstrap", "default", or an image reference.
    """
    t0 = time.monotonic()
    engine = engine or detect_engine()
    base_seconds = 0.0
    if base == "auto":
        base = "debootstrap" if engine.name == "podman" else "default"
    if base == "debootstrap":
        if engine.name != "podman":
            raise ImageBuildError("the debootstrapped base is imported with podman; use --engine podman")
        base_ref, made = ensure_base(engine, say=say)
        base_seconds = time.monotonic() - t0 if made else 0.0
    elif base == "default":
        base_ref = ""
    else:
        base_ref = base
    base_id = engine.inspect(base_ref, "{{.Id}}") if base_ref and engine.image_exists(base_ref) else ""
    digest = inputs_digest(base_ref, base_id, repo)
    if not force and engine.image_exists(tag) and \
            engine.inspect(tag, f'{{{{index .Config.Labels "{INPUTS_LABEL}"}}}}') == digest:
        return BuildResult(tag, engine.name, base_ref or "default", int(engine.inspect(tag, "{{.Size}}")),
                           time.monotonic() - t0, base_seconds, cached=True)
    previous = engine.inspect(tag, "{{.Id}}") if engine.image_exists(tag) else ""
    args = ["build", "-f", str(repo / DOCKERFILE), "-t", tag, "--label", f"{INPUTS_LABEL}={digest}"]
    if base_ref:
        args += ["--build-arg", f"BASE_IMAGE={base_ref}"]
    if engine.name == "podman":
        # docker format: the OCI image config has no HEALTHCHECK and podman would drop it.
        args += ["--format", "docker", "--layers", "--ignorefile", str(repo / IGNOREFILE), *RUN_FLAGS]
        if CA_BUNDLE.exists():
            args += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro", "--build-arg", f"PIP_CERT={CA_BUNDLE}"]
    args.append(str(repo))
    say(f"building {tag} with {engine.name}" + (f" from {base_ref}" if base_ref else ""))
    proc = subprocess.run(engine.argv(*args), capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise ImageBuildError(f"{engine.name} build failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    # The previous build of this tag, now untagged (a full copy of the venv each time); the
    # build stage's images stay, they are the layer cache.
    if previous and previous != engine.inspect(tag, "{{.Id}}"):
        engine.run("rmi", previous, check=False, timeout=300)
    return BuildResult(tag, engine.name, base_ref or "default", int(engine.inspect(tag, "{{.Size}}")),
                       time.monotonic() - t0, base_seconds, cached=False)
