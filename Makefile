# make test: build everything from nothing, type-check, build the docs site, and run the whole suite.
# make docs: the documentation site into site/ (mkdocs; see mkdocs.yml).
# make demo: build, then run the main job.
# make bench: every benchmark that publishes a page (see below).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The C sources of shmbus.shm._native and netbridge._io: a change rebuilds them.
NATIVE := $(wildcard shmbus/shm/native/*.[ch] netbridge/native/*.[ch])

.PHONY: test typecheck docs demo bench lint clean system-deps build-deps aeron-c

# Tools the tests use beyond pip, installed when missing (CI runs as root on Debian).
system-deps:
	@command -v tshark >/dev/null || { \
		echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tshark >/dev/null; }
	@command -v ip >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; }
	@command -v java >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null; }
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# netbridge._io links OpenSSL's libcrypto (sealed datagrams): its headers before anything compiles.
build-deps:
	@test -f /usr/include/openssl/evp.h || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libssl-dev >/dev/null; }

$(STAMP): $(BIN)/python pyproject.toml setup.py $(NATIVE) | build-deps
	$(BIN)/pip install --quiet -e '.[dev,bench,spark]'
	touch $(STAMP)

install: $(STAMP)

typecheck: $(STAMP)
	$(BIN)/mypy

# The site the docs test (tests/docs/) serves and opens in headless Chromium; --strict: a warning
# (a broken link, a docstring mkdocstrings cannot render) fails the build. NO_MKDOCS_2_WARNING
# quiets mkdocs-material's banner about MkDocs 2.0.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Aeron's C client (libaeron.so) and C media driver (aeronmd), built from the pyaeron sdist into
# build/aeron/ by tools/aeron_c/build.sh when either is missing (about 35 s from nothing on 2
# cores; needs PyPI): the tests, the nemesis and tools/bench/aeron_clients.py run C programs
# against aeronc.h (tools/aeron_c/c/).
# Aeron's CMake project enables C++ too: g++ installed first when there is no c++.
AERON_C := build/aeron
aeron-c:
	@if ! test -e $(AERON_C)/lib/libaeron.so || ! test -e $(AERON_C)/bin/aeronmd; then \
		command -v c++ >/dev/null || { apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null; }; \
		bash tools/aeron_c/build.sh; \
	fi

test: typecheck system-deps docs aeron-c
	$(BIN)/python -m pytest -q tests

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# make bench: the benchmarks that publish a page, full length (about an hour; run it on a
# quiet machine), each writing its dated page and plots into docs/benchmarks/. aeron_clients
# runs Aeron's C client on the shmbus driver: it needs make aeron-c. pyaeron's page
# needs a Python >= 3.12 with pyaeron and shmbus installed: PYAERON_PY (without it, the page
# is left as it is and the reason printed). fanout makes network namespaces: run as root.
PAGES := docs/benchmarks
PYAERON_PY ?= /tmp/pyaeron-venv/bin/python
bench: $(STAMP) aeron-c
	$(BIN)/python -m tools.bench.ipc --page $(PAGES)
	$(BIN)/python -m tools.bench.large_messages --page $(PAGES)
	$(BIN)/python -m tools.bench.request_reply --page $(PAGES)
	$(BIN)/python -m tools.bench.late_join --page $(PAGES)
	$(BIN)/python -m tools.bench.fanout --page $(PAGES)
	$(BIN)/python -m tools.bench.aeron_clients --page $(PAGES)
	@if $(PYAERON_PY) -c 'import pyaeron, shmbus' 2>/dev/null; then \
		$(PYAERON_PY) -m pip install --quiet matplotlib && \
		$(PYAERON_PY) -m tools.bench.pyaeron --page $(PAGES); \
	else echo "pyaeron page not rerun: $(PYAERON_PY) cannot import pyaeron and shmbus"; fi

lint: typecheck
	$(BIN)/ruff check shmbus netbridge tests tools examples docs/_ext

clean:
	rm -rf $(VENV) build site *.egg-info shmbus/shm/*.so netbridge/*.so
