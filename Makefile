# The commands of the README:
#   make up    - a whole local cluster streaming a sample corpus; prints the page's URL
#   make check - the quick tier: the tests of pure logic, with the venv alone (no root, Kafka, namespaces,
#                containers or browser)
#   make test  - installs everything (as root: apt packages, the image) and runs the whole suite against a real
#                Kafka broker
#   make image - builds deploy/Dockerfile (podman from a debootstrapped Debian base without a Docker daemon)
# Each target does all of its own set-up on a fresh machine.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: up check test bench install kafka-jars browser container-tools ops-tools moosefs image clean

$(STAMP): pyproject.toml setup.py online/search/int8_scan.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -e ".[test,bench]"
	touch $(STAMP)

install: $(STAMP)

# Resolves the Apache Kafka broker jars from Maven Central into ~/.cache/livevec/ (once).
kafka-jars: $(STAMP)
	$(PY) -m online.cli kafka fetch

# Debian's Chromium, for the browser test of the live page (no browser download from a hub).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "install Debian's chromium package (sudo apt-get install chromium) for the browser test"; exit 1; fi; }

# Debian's podman, runc and debootstrap, to build and run the image without a Docker daemon.
container-tools:
	@{ command -v podman && command -v runc && command -v debootstrap; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null; \
	  else echo "install Debian's podman, runc and debootstrap (sudo apt-get install podman runc debootstrap) to build the image"; exit 1; fi; }

# promtool from Debian's prometheus package, to check and unit-test deploy/prometheus/ (tests/test_ops_dashboards.py).
# Without recommends (no node exporter); the Prometheus daemon the package installs is stopped and disabled.
ops-tools:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
	    && { systemctl disable --now prometheus >/dev/null 2>&1 || { service prometheus stop; update-rc.d prometheus disable; } >/dev/null 2>&1 || true; }; \
	  else echo "install Debian's prometheus package (sudo apt-get install --no-install-recommends prometheus) for promtool, used by the alert-rule tests"; exit 1; fi; }

# Debian's MooseFS (master, chunkserver, client), the seed's shared file system: `livevec up --hosts N` mounts it on
# every lab host, and tests/test_moosefs_storage.py runs its faults. mfsmount also needs /dev/fuse.
moosefs:
	@{ command -v mfsmaster && command -v mfschunkserver && command -v mfsmount; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq moosefs-master moosefs-chunkserver moosefs-client >/dev/null; \
	  else echo "install Debian's moosefs-master, moosefs-chunkserver and moosefs-client (sudo apt-get install ...) for the shared file system"; exit 1; fi; }

# The container image: docker where a daemon answers, else podman; the base and the image are
# rebuilt only when their inputs change. Prints the tag, the size and the build time. The tag is the release's
# (online/__init__.py).
IMAGE ?= livevec:$(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' online/__init__.py)
image: $(STAMP)
	@docker info >/dev/null 2>&1 || $(MAKE) --no-print-directory container-tools
	$(PY) -m online.cli deploy image --tag $(IMAGE)

up: $(STAMP) kafka-jars
	$(VENV)/bin/livevec up

# The markers say what a test needs beyond the venv (pyproject.toml declares them; the README lists them).
CHECK_MARKERS := not kafka and not slow and not browser and not root

# Two pytest processes (pytest-xdist), one a core: a cold numba cache compiles the kernels in both at once, and the
# tier takes 2m22s on 2 cores from a fresh clone against 3m53s in one process.
check: $(STAMP)
	$(PY) -m pytest -q -ra -n 2 -m "$(CHECK_MARKERS)" $(PYTEST_ARGS)

# Two pytest processes as well: most tests wait on processes, brokers and sockets rather than compute, so two at a
# time keep the load near 2 and the suite near half its time in one process. Each file runs in one process (its
# module fixtures start once); the tests that change the machine share one lane (tests/conftest.py).
test: $(STAMP) kafka-jars browser ops-tools moosefs image
	$(PY) -m pytest -ra --durations=15 -n 2 --dist loadfile $(PYTEST_ARGS)

# Every benchmark with small arguments; BENCH_ARGS=--full for the README's figures (hours).
bench: $(STAMP) kafka-jars
	$(PY) bench/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
