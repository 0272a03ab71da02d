# Every target creates (or reuses) the virtual environment first, so on a fresh machine
# `make demo` and `make test` are the only commands needed.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.trtqat-installed
# torch/torchvision releases to install (override for another platform or CUDA build)
TORCH  ?= torch==2.14.1 torchvision==0.29.1

.PHONY: install demo test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "setuptools>=64" wheel
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-build-isolation -e ".[dev]"
	touch $@

demo: $(STAMP)
	$(VENV)/bin/trtqat demo

lint: $(STAMP)
	$(PY) -m ruff check trtqat tests benchmarks

# the suite on every core (one worker per core, each test file on one worker)
test: lint
	$(PY) -m pytest -q -n auto --dist loadfile

bench: $(STAMP)
	$(PY) benchmarks/qat_overhead.py

clean:
	rm -rf build *.egg-info trtqat/*.so trtqat/**/*.so
