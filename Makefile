# Two entry points that work on a fresh Linux machine with python3 (3.9-3.13, with shared libpython):
#   make demo   set everything up, start a server with a model, call it, print the result
#   make test   set everything up and run the test suite
# Another interpreter: make test PYTHON=python3.13 VENV=.venv-py3.13 (one venv per interpreter; the
# server install in $PYTRITON_HOME is shared, the stub environment is made per interpreter).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

# test-tools: what only the tests use (gdb).
.PHONY: demo test test-tools test-all test-numpy1 test-unit test-e2e server allocator bench soak soak-short rollout-test test-triton-older test-ray lint docs clean

$(VENV)/.test-deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

$(VENV)/.dev-deps: pyproject.toml $(VENV)/.test-deps
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

server: $(VENV)/.test-deps allocator
	$(VENV)/bin/pytriton install-server

# jemalloc for tritonserver: pytriton preloads it into the server when it is installed, so memory
# freed after large requests goes back to the system (docs/soak.md, "Server memory and the
# allocator"). Installs Debian's/Ubuntu's package where this runs as root with apt-get (CI); elsewhere
# it says what to run. Never fails the build: without jemalloc the server runs with glibc's malloc.
allocator:
	@if ldconfig -p 2>/dev/null | grep -q 'libjemalloc\.so\.2'; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "allocator: installing libjemalloc2 (apt-get)"; \
		{ apt-get install -y -qq --no-install-recommends libjemalloc2 >/dev/null 2>&1 || \
		  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends libjemalloc2 >/dev/null 2>&1; }; } || \
		echo "allocator: could not install libjemalloc2; tritonserver runs with glibc's malloc (docs/soak.md)"; \
	else \
		echo "allocator: jemalloc is not installed; as root run: apt-get install libjemalloc2 (Debian/Ubuntu) or"; \
		echo "  dnf install jemalloc (RHEL/Fedora). tritonserver runs with glibc's malloc meanwhile (docs/soak.md)."; \
	fi

demo: server
	$(PY) examples/quickstart.py

# PYTEST_ARGS: extra pytest arguments (CI passes --durations=25, and --lf for its one rerun).
PYTEST_ARGS ?=
# TEST_MARK: a pytest -m expression choosing the tests of `make test` and `make test-numpy1`; empty
# (the default) runs them all. CI's legs pass "not e2e" (unit tests) and "e2e and py39_leg" and the
# like (the e2e modules listed for that leg in tests/e2e/conftest.py; docs/development.md, "CI").
TEST_MARK ?=
# The `ray` tests need Ray in the environment: `make test-ray` runs them; every other target leaves them out.
PYTEST_SELECT = tests -m "$(if $(TEST_MARK),($(TEST_MARK)) and not ray,not ray)"

test: server test-tools
	$(PY) -m pytest -q $(PYTEST_SELECT) $(PYTEST_ARGS)

# gdb for the tests that stop a stub at one exact instruction (inside one of the Python backend's
# locks, tests/e2e/test_unresponsive.py). Installed like the allocator where this runs as root with
# apt-get (CI); elsewhere those tests are skipped, with the reason. Never fails the build.
test-tools:
	@if command -v gdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "test-tools: installing gdb (apt-get)"; \
		{ apt-get install -y -qq --no-install-recommends gdb >/dev/null 2>&1 || \
		  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends gdb >/dev/null 2>&1; }; } || \
		echo "test-tools: could not install gdb; the tests that need it are skipped"; \
	else \
		echo "test-tools: gdb is not installed (apt-get install gdb); the tests that need it are skipped"; \
	fi

# The full matrix: CI with every leg running the whole suite (about 50 minutes on the 2-core CI
# machine). Run it before resolving a large change; `.ci/run` runs the e2e slices instead.
test-all:
	CI_FULL_MATRIX=1 .ci/run

# The same suite with numpy 1.x in the user's environment (.venv has numpy 2). There is no
# numpy 1.x for Python 3.13 and later, so there the target says so and does nothing.
NP1_VENV ?= .venv-numpy1
test-numpy1: server
	@if ! $(PYTHON) -c 'import sys; sys.exit(sys.version_info >= (3, 13))'; then \
		echo "test-numpy1: numpy 1.x does not exist for this Python; nothing to run"; exit 0; fi; \
	set -e; \
	if [ ! -f $(NP1_VENV)/.deps ] || [ pyproject.toml -nt $(NP1_VENV)/.deps ]; then \
		$(PYTHON) -m venv $(NP1_VENV); \
		$(NP1_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]' 'numpy<2'; \
		touch $(NP1_VENV)/.deps; fi; \
	$(NP1_VENV)/bin/python -c 'import numpy; print("numpy", numpy.__version__)'; \
	$(NP1_VENV)/bin/python -m pytest -q $(PYTEST_SELECT) $(PYTEST_ARGS)

# An older supported Triton build (docs/development.md, "An older Triton build"): install it beside the
# default one and run the end-to-end smoke and security tests against it (PYTRITON_TRITON_VERSION).
# TRITON_OLDER_WHEEL: the nvidia-pytriton wheel of that build on disk (offline; still sha256-checked).
TRITON_OLDER ?= 2.48
TRITON_OLDER_WHEEL ?=
TRITON_OLDER_TESTS ?= tests/e2e/test_check.py tests/e2e/test_lifecycle.py tests/e2e/test_clients.py \
	tests/e2e/test_security.py tests/e2e/test_hostile_requests.py tests/e2e/test_healing.py \
	tests/e2e/test_build_differences.py
# Left out on 2.48 to 2.50 (every older build): they send requests into a stub that then dies, and
# those builds never answer such a request (gate dead-stub-request-unanswered, server/versions.py);
# tests/e2e/test_build_differences.py pins what each build does instead.
TRITON_OLDER_DESELECT ?= tests/e2e/test_healing.py::test_killed_stub_is_replaced \
	tests/e2e/test_healing.py::test_a_stopped_stub_fails_requests_fast_and_is_replaced_without_a_server_abort \
	tests/e2e/test_healing.py::test_stub_deaths_under_traffic_leave_no_threads_or_regions_behind \
	tests/e2e/test_healing.py::test_pinned_generations_under_traffic_replace_the_server_at_the_limit
test-triton-older: server
	$(VENV)/bin/pytriton install-server --triton $(TRITON_OLDER) $(if $(TRITON_OLDER_WHEEL),--from-wheel $(TRITON_OLDER_WHEEL))
	PYTRITON_TRITON_VERSION=$(TRITON_OLDER) $(VENV)/bin/pytriton check --no-smoke | grep 'server version'
	PYTRITON_TRITON_VERSION=$(TRITON_OLDER) $(PY) -m pytest -q $(TRITON_OLDER_TESTS) \
		$(foreach test,$(TRITON_OLDER_DESELECT),--deselect $(test)) $(PYTEST_ARGS)

# pytriton.ray on a local two-node Ray cluster (tests/e2e/test_ray.py, marker `ray`; docs/ray.md):
# its own venv with ray[serve] (Python 3.10+; about 100 MB), the server shared with the others.
RAY_VENV ?= .venv-ray
test-ray: server
	@if ! $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then \
		echo "test-ray: Ray 2.60 needs Python 3.10 or later; run make test-ray PYTHON=python3.11"; exit 1; fi; \
	set -e; \
	if [ ! -f $(RAY_VENV)/.deps ] || [ pyproject.toml -nt $(RAY_VENV)/.deps ]; then \
		$(PYTHON) -m venv $(RAY_VENV); \
		$(RAY_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,ray]'; \
		touch $(RAY_VENV)/.deps; fi; \
	$(RAY_VENV)/bin/python -m pytest -q -m ray tests/e2e/test_ray.py $(PYTEST_ARGS)

test-unit: $(VENV)/.test-deps
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

bench: server $(VENV)/.dev-deps
	PYTHON=$(PY) bash bench/setup_perf_analyzer.sh
	$(PY) -m bench

# Soak and fault suite (bench/soak.py): bit-exact load, memory over time, fault probes; JSON + plot
# in bench/results/soak/. soak-short is the bounded version CI runs (about 2 minutes).
soak: server $(VENV)/.dev-deps
	$(PY) -m bench.soak --mixed-connections 48

soak-short: server
	$(PY) -m bench.soak --short

# Rolling restart of three replicas behind nginx under load (bench/rollout.py, docs/rollout.md):
# fails if any request fails; about 30-40 s. Needs nginx (apt-get install -y nginx; no root to run).
rollout-test: server
	$(PY) -m bench.rollout

# The container image and the Kubernetes manifests for real (deploy/deploy_check.sh, docs/deployment.md):
# builds deploy/Dockerfile on a local Debian base (podman, offline), runs it read-only as a non-root
# user, drains it with SIGTERM under load, plays deploy/kubernetes/ with `podman kube play` and
# replaces its pod under load; zero failed requests. Root, podman, runc and debootstrap needed
# (apt-get install -y podman runc buildah slirp4netns debootstrap); a few minutes, not in `make test`.
.PHONY: deploy-check
deploy-check: $(VENV)/.test-deps
	PY=$(abspath $(PY)) bash deploy/deploy_check.sh

lint: $(VENV)/.dev-deps
	$(VENV)/bin/ruff check pytriton tests bench examples deploy tools
	$(VENV)/bin/ruff format --check pytriton tests bench examples deploy tools
	$(VENV)/bin/mypy pytriton

# The documentation site (mkdocs.yml) into site/, from a venv of its own so that `make test`'s
# venv needs no mkdocs. --strict: a broken link or anchor, a page missing from the nav or a
# docstring the API reference cannot parse fails the build. The reference reads the source
# statically (griffe); the package is installed there only to resolve the `docs` extra.
DOCS_VENV ?= .venv-docs
$(DOCS_VENV)/.docs-deps: pyproject.toml
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[docs]'
	touch $@

docs: $(DOCS_VENV)/.docs-deps
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site
	$(DOCS_VENV)/bin/python tools/docs_roles.py site  # no raw role or maintainers' note in the reference

clean:
	rm -rf $(VENV) $(NP1_VENV) $(DOCS_VENV) .venv-py3.* build *.egg-info site
