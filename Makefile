# Phalanx: the two set-up commands of the README.
#   make run    create .venv, install, fetch the bundled model, migrate, register, start the array
#   make test   create .venv, install with test extras (and Debian's chromium), run the tests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
NODES ?= 2

.PHONY: run test bench-quick install browser mutation

# llama-cpp-python is built for x86-64-v3 (AVX2, FMA, F16C), not for the build machine
# (GGML_NATIVE): a CPU can report instruction sets its kernel or hypervisor does not let a
# process use (AMX tiles here: SIGILL in the first batch), and a wheel built for one machine
# must run on the next. Built once per version and flags into ~/.cache/phalanx-wheels.
LLAMA_VERSION := 0.3.36
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
endif
# LLAMA_EXTRA_CMAKE_ARGS adds options to these (what a device validation's cpu.build warning
# names: make -B install LLAMA_EXTRA_CMAKE_ARGS="-DGGML_AVX512=ON"); -B because .installed is
# newer than pyproject.toml, so a plain make install has nothing to do.
LLAMA_ALL_CMAKE_ARGS := $(strip $(LLAMA_CMAKE_ARGS) $(LLAMA_EXTRA_CMAKE_ARGS))
WHEELS := $(HOME)/.cache/phalanx-wheels/$(shell echo '$(LLAMA_VERSION) $(LLAMA_ALL_CMAKE_ARGS)' | sha256sum | cut -c1-12)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || CMAKE_ARGS="$(LLAMA_ALL_CMAKE_ARGS)" $(PY) -m pip wheel --quiet --no-deps --no-cache-dir --no-binary llama-cpp-python -w $(WHEELS) llama-cpp-python==$(LLAMA_VERSION)
	$(PY) -m pip install --quiet --no-index --no-deps --force-reinstall --find-links $(WHEELS) llama-cpp-python==$(LLAMA_VERSION)
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
	$(VENV)/bin/lint-imports
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
