# The two set-up commands on a fresh machine: `make run` and `make test` (each creates .venv on first use).
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run deps test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/ddptop $(ARGS)

# The commands the tests run besides Python (tmux, iproute2, setpriv, ...): installed as root when missing, else named.
deps:
	bash scripts/ci-deps.sh

# Two phases: most tests two at a time (a file per worker, so module fixtures run once), then the tests that
# measure time, rates or CPU shares on a machine that runs nothing else. Exit code 5: nothing of that phase selected.
# --durations: the suite's time is issue 22's open item; each CI log names the slowest tests of each phase.
test: deps $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not alone" --durations=25 $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -q -p no:xdist -m alone --durations=25 $(PYTEST_ARGS) || [ $$? -eq 5 ]

bench: $(STAMP)
	$(PY) benchmarks/step_overhead.py

clean:
	rm -rf $(VENV)
