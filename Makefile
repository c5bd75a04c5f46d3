# Phalanx: the two set-up commands of the README.
#   make run    create .venv, install, fetch the bundled model, migrate, register, start the array
#   make test   create .venv, install with test extras (and Debian's chromium), run the tests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
NODES ?= 2

.PHONY: run test bench-quick install browser mutation llama-cmake-args

# llama-cpp-python is built for x86-64-v3 (AVX2, FMA, F16C) plus the AVX-512 and VNNI sets
# this machine's kernel lists in /proc/cpuinfo (it lists a set only where it saves that set's
# registers), never with GGML_NATIVE: a CPU can report instruction sets a process may not use
# (AMX tiles here: SIGILL in the first batch), so AMX is never built in. On an AVX-512 CPU the
# sets add 1.2-1.3x at 8 streams of the repacked Q4_0 (docs/validation.md has the figures).
# Built once per version and flags into ~/.cache/phalanx-wheels.
LLAMA_VERSION := 0.3.36
CPUINFO ?= /proc/cpuinfo
ifeq ($(shell uname -m),x86_64)
CPU_FLAGS := $(shell grep -m1 '^flags' $(CPUINFO) 2>/dev/null)
# $(call if_cpu_has,flags,option): the option when the CPU lists every one of the flags
if_cpu_has = $(if $(filter-out $(CPU_FLAGS),$(1)),,$(2))
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	$(call if_cpu_has,avx512f avx512cd avx512vl avx512dq avx512bw,-DGGML_AVX512=ON \
		$(call if_cpu_has,avx512vbmi,-DGGML_AVX512_VBMI=ON) \
		$(call if_cpu_has,avx512_vnni,-DGGML_AVX512_VNNI=ON) \
		$(call if_cpu_has,avx512_bf16,-DGGML_AVX512_BF16=ON)) \
	$(call if_cpu_has,avx_vnni,-DGGML_AVX_VNNI=ON)
endif
# LLAMA_EXTRA_CMAKE_ARGS adds options to these (what a device validation's cpu.build warning
# names: make -B install LLAMA_EXTRA_CMAKE_ARGS="-DGGML_AVX512=ON"); -B because .installed is
# newer than pyproject.toml, so a plain make install has nothing to do (and a later plain
# make install keeps what it built: only this machine's own flags are stamped below).
LLAMA_ALL_CMAKE_ARGS := $(strip $(LLAMA_CMAKE_ARGS) $(LLAMA_EXTRA_CMAKE_ARGS))
# $(call hash12,text): the first 12 hex digits of the text's sha256
hash12 = $(shell echo '$(1)' | sha256sum | cut -c1-12)
WHEELS := $(HOME)/.cache/phalanx-wheels/$(call hash12,$(LLAMA_VERSION) $(LLAMA_ALL_CMAKE_ARGS))
# A venv is stamped with this machine's flags (a file named by their hash): when its CPU lists
# other sets (a disk moved to another machine), the stamp is missing and make install (run,
# test) installs the venv again. The flags it was built with are recorded beside it.
CPU_STAMP := $(VENV)/.llama-cpu-$(call hash12,$(LLAMA_VERSION) $(strip $(LLAMA_CMAKE_ARGS)))

$(CPU_STAMP):
	@mkdir -p $(VENV) && rm -f $(VENV)/.llama-cpu-* && touch $@

# the flags llama-cpp-python is built with on this machine
llama-cmake-args:
	@echo '$(LLAMA_ALL_CMAKE_ARGS)'

$(VENV)/.installed: pyproject.toml $(CPU_STAMP)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || CMAKE_ARGS="$(LLAMA_ALL_CMAKE_ARGS)" $(PY) -m pip wheel --quiet --no-deps --no-cache-dir --no-binary llama-cpp-python -w $(WHEELS) llama-cpp-python==$(LLAMA_VERSION)
	$(PY) -m pip install --quiet --no-index --no-deps --force-reinstall --find-links $(WHEELS) llama-cpp-python==$(LLAMA_VERSION)
	$(PY) -m pip install --quiet -e '.[test,scale,bench]'
	echo '$(LLAMA_ALL_CMAKE_ARGS)' > $(VENV)/.llama-cmake-args
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
