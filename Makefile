# Two commands set up everything on a fresh machine with Python 3.11 and Java 17:
#   make demo   installs Herald, runs the embedded broker, a demo subscriber and the delivery job
#   make test   installs Herald and runs the whole test suite (two pytest workers)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The Spark Herald's own work runs on (the wheel itself requires none: a cluster's pyspark is the platform's).
SPARK_PINS := constraints/spark-4.2.txt

.PHONY: install lint test unit demo bench dist clean compat compat-stack

# After pip: the JVM parts, each fetched once from Maven Central into ~/.cache/herald (later runs find them there):
# Spark's Kafka source and delta-spark, which Herald's local sessions load, and Apache Kafka's own broker, which
# the tests on a real Kafka start (tests/support/kafka_broker.py).
install: $(STAMP)
	$(BIN)/herald jars fetch
	$(BIN)/python -m tests.support.kafka_dist

$(STAMP): pyproject.toml $(SPARK_PINS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,spark]' -c $(SPARK_PINS)
	@touch $(STAMP)

# Two pytest-xdist workers, a test file each at a time (its module fixtures stay in one process), handed out in
# collection order: the files that take minutes first (tests/conftest.py SLOW_FILES_FIRST; xdist's default
# reorder, most tests first, would put them last), so that both workers end together. The slowest tests listed.
test: install
	$(BIN)/python -m pytest -q -rs -n 2 --dist loadfile --no-loadscope-reorder --durations=20

# ruff, as configured in pyproject.toml (pip's install only).
lint: $(STAMP)
	$(BIN)/ruff check src tests

# The unit tests need no JVM part: pip's install only (no jars, no Kafka download).
unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

demo: install
	$(BIN)/herald demo --conf conf

bench: install
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	$(BIN)/python tests/benchmarks/serial_throughput.py

# The wheel, and the same archive as dist/herald-<version>.zip for `spark-submit --py-files`: Spark puts a .zip of
# --py-files on the executors' Python path, a .whl on the driver's alone (docs/operations.md, "On a cluster").
dist: install
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir dist .
	@for wheel in dist/herald-*-py3-none-any.whl; do cp "$$wheel" "$${wheel%-py3-none-any.whl}.zip"; done
	@ls dist/*.whl dist/*.zip

clean:
	rm -rf $(VENV) .venv-spark-* .venv-wheel-* .herald build dist src/*.egg-info .pytest_cache

# The compatibility stage (.ci/run): Herald's end-to-end subset on the other Spark releases platforms ship (4.0:
# Databricks 17.3 LTS; 4.1: 18.x), each on Python 3.12 in a venv of its own with its jars fetched by `herald jars
# fetch`: the engine end to end, both stacks' parity, spark-submit, and the demo. Then the wheel, installed on Python
# 3.10 and 3.13 next to a pyspark already there, which it must leave as it was.
COMPAT_SPARKS := 4.0 4.1
COMPAT_PYTHON ?= 3.12
COMPAT_TESTS := tests/integration/test_stack_parity.py tests/integration/test_spark_submit_entry.py \
	tests/integration/test_engine_e2e.py::test_pipeline_delivers_filters_retries_discards_and_records_everything
compat: dist
	@for spark in $(COMPAT_SPARKS); do $(MAKE) --no-print-directory compat-stack SPARK=$$spark || exit 1; done
	.ci/wheel-beside-pyspark 3.10 4.0.0
	.ci/wheel-beside-pyspark 3.13 4.1.1

compat-stack:
	@test -x .venv-spark-$(SPARK)/bin/python || $$(.ci/python-of $(COMPAT_PYTHON)) -m venv .venv-spark-$(SPARK)
	.venv-spark-$(SPARK)/bin/python -m pip install --quiet --upgrade pip
	.venv-spark-$(SPARK)/bin/python -m pip install --quiet -e '.[test,spark]' -c constraints/spark-$(SPARK).txt
	.venv-spark-$(SPARK)/bin/herald jars fetch
	.venv-spark-$(SPARK)/bin/python -m tests.support.kafka_dist
	.venv-spark-$(SPARK)/bin/python -c "import sys, pyspark, delta; print('compat:', sys.version.split()[0], \
		'pyspark', pyspark.__version__)"
	SPARK_SUBMIT_OPTS= .venv-spark-$(SPARK)/bin/python -m pytest -q -rs -n 2 --dist loadfile $(COMPAT_TESTS)
	.venv-spark-$(SPARK)/bin/herald demo --conf conf
