# The two commands of the README: `make run` (train the default model if needed, then serve it)
# and `make test` (the whole test suite). Both create .venv and install the project on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export BENTOML_DO_NOT_TRACK := true
export HF_DATASETS_OFFLINE := 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# The browser tests use the system Chromium; Playwright never downloads one.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

.PHONY: run test test-ray test-bento test-label-studio lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# service/requirements.txt pins what the service runs with; the bento carries the same pins.
$(STAMP): pyproject.toml service/requirements.txt | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,ray,glove]' -c service/requirements.txt
	touch $(STAMP)

install: $(STAMP)

# The suite's test files spread over TEST_JOBS processes (pytest-xdist), a file's tests in one process
# so that a module's server starts once; TEST_JOBS=0 runs them all in this process.
TEST_JOBS ?= 2

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile -m "not ray and not bento and not label_studio" $(PYTEST_ARGS)

# han-score's Ray engine (tests/test_scoring_ray.py, about 1.5 minutes: a local Ray cluster per job), apart so
# that make test stays within ten minutes.
test-ray: $(STAMP)
	$(BIN)/python -m pytest -m ray $(PYTEST_ARGS)

# The bento a user ships, built, installed from its own requirements in a fresh virtual environment
# and served from outside the checkout (tests/test_bento.py, 1.5 to 2.5 minutes: mostly pip).
test-bento: $(STAMP)
	$(BIN)/python -m pytest -m bento $(PYTEST_ARGS)

# han-label with a real Label Studio (tests/test_label_studio.py): the PyPI package in an environment of
# its own, cached in ~/.cache/han-tests (the first install 1.5 to 3 minutes, mostly pip; then about a minute).
test-label-studio: $(STAMP)
	$(BIN)/python -m pytest -m label_studio $(PYTEST_ARGS)

run: $(STAMP)
	$(BIN)/python -m service.run

# The code is laid out by hand within ruff's 120 columns (ruff check enforces them); ruff format is not used.
lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
