# The two commands: `make demo` and `make test`.  Each sets up what it needs
# (apt packages, a venv with pinned deps, the build) and reuses it next time.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUILD := build
STAMPS := .stamps
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := g++ libgtest-dev ccache
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test test-cpp test-python build setup test-sanitize fuzz clean

demo: build
	$(PY) examples/demo.py

test: test-cpp test-python

test-cpp: build
	ctest --test-dir $(BUILD) --output-on-failure

test-python: build
	$(PY) -m pytest -q tests

build: $(STAMPS)/installed
	cmake --build $(BUILD)

setup: $(STAMPS)/installed

$(STAMPS)/apt:
	@mkdir -p $(STAMPS)
	@if ! dpkg -s $(APT_PACKAGES) >/dev/null 2>&1; then \
	  echo "Installing apt packages: $(APT_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(APT_PACKAGES); \
	fi
	@touch $@

$(STAMPS)/venv: requirements.txt
	@mkdir -p $(STAMPS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt 2>&1 | grep -v "is ignored" || true
	@$(PY) -c "import torch, transformers; assert torch.__version__.startswith('2.13.0')"
	@touch $@

$(BUILD)/build.ninja: $(STAMPS)/apt $(STAMPS)/venv CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DPython3_EXECUTABLE=$(CURDIR)/$(PY)

$(STAMPS)/installed: $(BUILD)/build.ninja pyproject.toml setup.py
	cmake --build $(BUILD)
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e . 2>&1 | grep -v "is ignored" || true
	@$(PY) -c "import importlib.metadata as m; assert m.version('torch-axon')"
	@touch $@

# The runtime's and the kernels' tests under ThreadSanitizer and AddressSanitizer.
test-sanitize: $(STAMPS)/apt $(STAMPS)/venv
	for s in thread address; do \
	  cmake -S . -B $(BUILD)-$$s -G Ninja -DAXON_BUILD_EXTENSION=OFF -DAXON_SANITIZE=$$s && \
	  cmake --build $(BUILD)-$$s && \
	  ctest --test-dir $(BUILD)-$$s --output-on-failure || exit 1; \
	done

# The differential fuzzer (axon vs CPU) for longer than make test's 20 s:
# AXON_FUZZ_SECONDS (default 600), AXON_FUZZ_SEED to start elsewhere.
fuzz: build
	AXON_FUZZ_SECONDS=$${AXON_FUZZ_SECONDS:-600} AXON_FUZZ_PROGRAMS=$${AXON_FUZZ_PROGRAMS:-100000000} \
	  $(PY) -m pytest -q -s tests/ops/test_fuzz.py

clean:
	rm -rf $(BUILD) $(BUILD)-thread $(BUILD)-address $(STAMPS) torch_axon/_C*.so
