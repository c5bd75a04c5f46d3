# Phalanx: the two set-up commands of the README.
#   make run    create .venv, install, fetch the bundled model, migrate, register, start the array
#   make test   create .venv, install with test extras (and Debian's chromium), run the tests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
NODES ?= 2

.PHONY: run test bench-quick install browser mutation

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,scale,bench]'
	touch $@

install: $(VENV)/.installed

run: install
	@command -v lspci >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pciutils >/dev/null) || true
	$(PY) manage.py up --nodes $(NODES) --port $(PORT)

# Debian's chromium (browser tests) and pciutils (lspci: device validation's accelerator list)
browser:
	@(command -v chromium && command -v lspci) >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium pciutils >/dev/null)

test: install browser
	$(PY) manage.py check
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) -m pytest -q -p no:cacheprovider

# Mutation testing of the pure modules listed in pyproject.toml [tool.mutmut]; prints the score
# of each (goal: >= 85% killed) and fails under it. Always a full run (about ten minutes):
# mutmut's cache re-tests changed functions, not functions whose tests changed.
mutation: install
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children 2 >/dev/null
	$(PY) -m tests.support.mutation_score --min 85

bench-quick: install
	$(PY) bench/engine_concurrency.py --quick
	$(PY) bench/multiturn.py --quick
