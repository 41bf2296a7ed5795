# h3render: the two commands a fresh machine needs are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: all install test test-fast demo lib fixtures bench faults clean

all: install

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Reinstall whenever a source of the package or the engine changed.
$(STAMP): $(PY) pyproject.toml CMakeLists.txt $(wildcard csrc/*.c csrc/*.h) $(shell find h3render -name '*.py' -o -name '*.html' -o -name '*.js' -o -name '*.css' 2>/dev/null)
	$(PIP) install -q ".[test]"
	touch $(STAMP)

install: $(STAMP)

# The whole suite, against the installed package (tests/ is not a package, so
# the source tree never shadows the installed one).
test: install
	cd tests && ../$(VENV)/bin/pytest -q $(PYTEST_ARGS)

# The suite without its slow tests (end-to-end workers, browsers), on another Python:
#   make test-fast PYTHON=python3.10 VENV=.venv-py310
test-fast: install
	cd tests && ../$(VENV)/bin/pytest -q -m "not slow" $(PYTEST_ARGS)

demo: install
	$(VENV)/bin/h3render demo

# Development build of the shared library next to the sources, for
# PYTHONPATH=. runs without reinstalling.
lib:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build -j2
	cp build/libh3render.so h3render/engine/

# Speed report: ratios against ggml (ggml-python in a bench-only venv) and diffusers'
# fp32 torch (the .venv-ref of `make fixtures`), written to docs/PERFORMANCE.md.
BENCH_VENV ?= .venv-bench
REF_PY ?= .venv-ref/bin/python
BENCH_THREADS ?= $(shell nproc 2>/dev/null || echo 2)
$(BENCH_VENV)/bin/python:
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q numpy "ggml-python==0.0.45"

bench: install $(BENCH_VENV)/bin/python
	@test -x $(REF_PY) || { echo "bench needs torch + diffusers at REF_PY=$(REF_PY): run 'make fixtures' or pass REF_PY=..."; exit 2; }
	$(PY) bench/bench_speed.py --ref-python $(REF_PY) --bench-python $(BENCH_VENV)/bin/python --threads $(BENCH_THREADS) --out docs/PERFORMANCE.md

# The fault table (tests/faults, also part of `make test`), then the soak: hundreds of
# random kills, Redis crashes, corrupt records and cancels over one sweep, bounded in time.
FAULTS_MINUTES ?= 8
faults: install
	cd tests && H3RENDER_FILE_KILLS=10 ../$(VENV)/bin/pytest -q faults
	$(PY) tests/faults/soak.py --minutes $(FAULTS_MINUTES)

# Regenerate the reference fixtures from diffusers and transformers (needs torch).
fixtures:
	$(PYTHON) -m venv .venv-ref
	.venv-ref/bin/pip install -q "torch==2.13.0" "diffusers==0.42.1" "transformers==5.23.0" "safetensors==0.8.0" "tokenizers==0.23.3" "gguf==0.19.0" accelerate numpy
	.venv-ref/bin/python tools/fixtures/make_fixtures.py

clean:
	rm -rf build $(VENV) h3render/engine/libh3render.so
