# Two commands set up everything on a fresh machine with Python 3.11 and Java 17:
#   make demo   installs Herald, runs the embedded broker, a demo subscriber and the delivery job
#   make test   installs Herald and runs the whole test suite (two pytest workers)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test unit demo bench dist clean

# After pip: the JVM parts, each fetched once from Maven Central into ~/.cache/herald (later runs find them there):
# Spark's Kafka source and delta-spark, which Herald's local sessions load, and Apache Kafka's own broker, which
# the tests on a real Kafka start (tests/support/kafka_broker.py).
install: $(STAMP)
	$(BIN)/herald jars fetch
	$(BIN)/python -m tests.support.kafka_dist

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

# Two pytest-xdist workers, a test file each at a time (its module fixtures stay in one process), handed out in
# collection order: the files that take minutes first (tests/conftest.py SLOW_FILES_FIRST; xdist's default
# reorder, most tests first, would put them last), so that both workers end together. The slowest tests listed.
test: install
	$(BIN)/python -m pytest -q -rs -n 2 --dist loadfile --no-loadscope-reorder --durations=20

unit: install
	$(BIN)/python -m pytest -q tests/unit

demo: install
	$(BIN)/herald demo --conf conf

bench: install
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	$(BIN)/python tests/benchmarks/serial_throughput.py

dist: install
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir dist .
	@ls dist/*.whl

clean:
	rm -rf $(VENV) .herald build dist src/*.egg-info .pytest_cache
