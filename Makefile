# Every target bootstraps .venv itself: on a fresh machine `make demo` and `make test`
# do all the set-up. The venv is (re)installed when missing or when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all demo test lint format unit docs config-reference bench faults clean sysdeps screenshots stress-test

# System packages the tests drive for real: headless Chromium (the console's browser tests)
# and Prometheus (the dashboard's series check). Installed only when missing (needs root).
SYSDEPS := chromium chromium-driver prometheus
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

all: test

# uv installs what pip would, several times faster (parallel downloads and builds): a
# fresh clone's install is a large part of `make test`'s time.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[dev]'
	@touch $(STAMP)

sysdeps:
	@if [ ! -x /usr/bin/chromium ] || ! command -v prometheus >/dev/null 2>&1; then \
		echo "installing $(SYSDEPS) (apt-get)"; \
		$(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(SYSDEPS); \
	fi

demo: $(STAMP)
	$(BIN)/ballast demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy src/ballast

format: $(STAMP)
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

# Two workers (each with its own etcd and Spark session): most tests wait on processes,
# sockets and timers, so two share this machine's two cores well; an idle worker takes
# tests queued for the other (worksteal), so neither ends long after. TEST_WORKERS=0: serial.
TEST_WORKERS ?= 2
unit: $(STAMP) sysdeps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

# The documentation site (mkdocs.yml, docs/): --strict makes every warning an error, so a
# broken link or a page missing from the navigation fails `make test`.
SITE := .site
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $(SITE)

# docs/configuration.md is generated from the pydantic models (src/ballast/config.py);
# tests/test_config_reference.py fails until it is regenerated after a change.
config-reference: $(STAMP)
	$(BIN)/python -m ballast.config_reference > docs/configuration.md

test: lint docs unit

# The whole suite STRESS_RUNS times (default 5) on two workers beside a CPU hog: a test
# that races instead of waiting on its event fails here before it fails in CI. JSON on
# stdout (every test that failed in any run), progress on stderr, logs in stress-logs/.
STRESS_RUNS ?= 5
stress-test: $(STAMP) sysdeps
	@$(BIN)/python -m tests.stress --runs $(STRESS_RUNS)

# Every fault-injection case RUNS times (default 10); JSON on stdout, progress on stderr.
RUNS ?= 10
faults: $(STAMP)
	@$(BIN)/python -m tests.faults.run --runs $(RUNS)

# The console's pages, as the README shows them (the browser tests, saving into docs/console).
screenshots: $(STAMP) sysdeps
	BALLAST_CONSOLE_SCREENSHOTS=docs/console $(BIN)/python -m pytest -q tests/console/test_browser.py

# Every benchmark at full size (some take minutes): JSON on stdout, names and wall times on
# stderr. BENCH_ARGS=--quick runs them as tests/test_benchmarks.py does.
bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do \
		echo "== $$b $(BENCH_ARGS)" >&2; start=$$(date +%s); \
		$(BIN)/python $$b $(BENCH_ARGS) || { echo "== $$b FAILED" >&2; exit 1; }; \
		echo "== $$b: $$(($$(date +%s) - start)) s" >&2; \
	done

clean:
	rm -rf $(VENV) $(SITE) .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info
