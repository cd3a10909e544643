# The two set-up commands on a fresh machine: `make run` and `make test` (each creates .venv on first use).
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/ddptop $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/step_overhead.py

clean:
	rm -rf $(VENV)
