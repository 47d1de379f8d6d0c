# The developer interface.  `make run` and `make test` are the two commands of the README: each
# installs what is missing (Debian packages, .venv, the compiled extension) and is fast when
# nothing changed.

PYTHON    ?= python3
VENV      := .venv
PY        := $(VENV)/bin/python
PIP       := $(VENV)/bin/pip
STAMP     := $(VENV)/.installed
APT_STAMP := $(VENV)/.apt-installed
EXT_SRC   := $(wildcard fastpath/*.pyx fastpath/*.pxd fastpath/includes/*.pxd fastpath/src/*.c fastpath/src/*.h) setup.py
EXT       := fastpath/.built
PYTEST    := $(PY) -m pytest
PYTEST_ARGS ?=
# sanitizer runs (part of `make test`): an AddressSanitizer build of the extension that the
# fastpath tests run against, and a libFuzzer target over the request path (ASan + UBSan)
ASAN_ROOT    := build/asan
ASAN_RUNTIME  = $(shell gcc -print-file-name=libasan.so)
LLHTTP_SRC   := /usr/share/llhttp
LLHTTP_INC   := /usr/share/include/llhttp
FUZZ_TARGETS := request memcached
FUZZ_SECONDS ?= 20
# both builds compile the debug checks in (fastpath/src/fp_debug.h: the state machine's assertions)
FUZZ_CFLAGS  := -g -O1 -Werror=implicit-function-declaration -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
                -DFASTPATH_CHECKS=1 -Ifastpath/src -I$(LLHTTP_INC)
FUZZ_SRC     := $(filter-out fastpath/src/%.h,$(wildcard fastpath/src/*.c)) \
                $(LLHTTP_SRC)/llhttp.c $(LLHTTP_SRC)/api.c $(LLHTTP_SRC)/http.c

.PHONY: dist drill bench-tools test-asan fuzz run cluster check test test-sqlite test-postgres load load-10k bench compile debug install migrate demo clean distclean help

help:
	@echo "make run      install what is missing, migrate, load demo data, run the whole stack"
	@echo "make cluster  the multi-host site in network namespaces (root): balancer, 2 web, 3 memcached, db, client"
	@echo "make drill    the failure drills in that cluster under 2,000 long-polling users (root; ~10 min)"
	@echo "make check    the edit loop: every layer's unit tests (no browser, cluster, load, e2e stack, PostgreSQL, ASan, fuzz; under 2 min)"
	@echo "make test     install what is missing, run the full test suite (SQLite, then PostgreSQL)"
	@echo "make load     run the locust simulation (a few hundred users, one minute) against the stack"
	@echo "make load-10k the 10,000-user polling run (locust --processes 2, ~8 min): CPU/RSS per component"
	@echo "make bench    run every benchmark; results and plots in bench/results/"
	@echo "make compile  rebuild the fastpath extension in place"
	@echo "make test-asan  the fastpath tests against an AddressSanitizer build"
	@echo "make fuzz     libFuzzer on the request path and the memcached client (FUZZ_SECONDS=20 each)"
	@echo "make dist     the fastpoll sdist and its manylinux wheel (libevent, libcrypto inside) in dist/"
	@echo "make clean    remove build products (keeps .venv and var/)"

$(APT_STAMP): deps/apt-packages.txt deps/install-apt.sh
	sh deps/install-apt.sh
	@mkdir -p $(VENV) && touch $@

$(STAMP): requirements.txt $(APT_STAMP)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	touch $@

$(EXT): $(STAMP) $(EXT_SRC)
	$(PY) setup.py -q build_ext --inplace
	touch $@

install: $(EXT)

compile:
	rm -f $(EXT)
	$(MAKE) $(EXT)

debug:
	FASTPATH_DEBUG=1 $(PY) setup.py -q build_ext --inplace --force
	rm -f $(EXT)

migrate: install
	$(PY) manage.py migrate --noinput -v 0

demo: migrate
	$(PY) manage.py seeddemo

# the demo data is loaded by runstack once memcached is up, so its answers are written there
run: migrate
	$(PY) manage.py runstack --demo

# every host in its own network namespace (plurksite/cluster/); needs root.  The cluster migrates
# its own PostgreSQL database, so only the install steps come first.  Ctrl-C removes all of it.
cluster: install
	$(PY) manage.py runcluster

# every failure drill under 2,000 long-polling users, one verdict line each; bench/results/drills.json
drill: install
	$(PY) manage.py drill --json bench/results/drills.json

# the edit loop: every layer's unit tests (plurksite, plurkcore on SQLite, fastpath, the source
# rules, bench/report.py, the load verdict), without the browser, the cluster, the locust runs,
# PostgreSQL, the end-to-end stacks, ASan or fuzzing.  `make test` is the full suite.
CHECK_TESTS := tests/test_sourcecode.py tests/test_layers.py tests/plurksite tests/fastpoll tests/plurkcore tests/fastpath \
               tests/examples tests/bench/test_report.py tests/load/test_judge.py
# Its tests mostly wait (timeouts, holds), so they run in CHECK_WORKERS processes (pytest-xdist).
CHECK_WORKERS ?= 4
check: install
	$(PYTEST) $(PYTEST_ARGS) -p no:cacheprovider -n $(CHECK_WORKERS) -m "not slow and not load and not browser and not postgres" $(CHECK_TESTS)

test: install bench-tools
	$(PYTEST) $(PYTEST_ARGS) tests
	PLURK_TEST_POSTGRES=1 $(PYTEST) $(PYTEST_ARGS) -p no:cacheprovider tests/plurkcore tests/fastpoll
	$(MAKE) test-asan fuzz

test-asan: install
	rm -rf $(ASAN_ROOT) && mkdir -p $(ASAN_ROOT)/fastpath
	cp -r fastpath/*.py fastpath/includes $(ASAN_ROOT)/fastpath/
	CFLAGS="$$CFLAGS -DFASTPATH_CHECKS=1" FASTPATH_SANITIZE=address,undefined $(PY) setup.py -q build_ext --force --build-lib $(ASAN_ROOT) --build-temp build/asan-tmp
	FASTPATH_ASAN_ROOT=$(CURDIR)/$(ASAN_ROOT) FASTPATH_ASAN_RUNTIME=$(ASAN_RUNTIME) \
		$(PYTEST) $(PYTEST_ARGS) -p no:cacheprovider tests/fastpath

# the C tools of bench/atr.py and bench/connbench.py: the load generator (keep-alive or one
# request per connection) and the kernel-only poll/epoll control; the smoke test in `make test`
# runs them too
BENCH_TOOLS  := build/bench/atr_client build/bench/pipetest
BENCH_CFLAGS := -O2 -g -std=c11 -Wall -Wextra -Werror

build/bench/%: bench/%.c bench/bench_tool.h
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) $< -o $@

bench-tools: $(BENCH_TOOLS)

build/fuzz/fuzz_%: fastpath/fuzz/fuzz_%.c $(EXT_SRC) $(APT_STAMP)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) $$(pkg-config --cflags libevent libcrypto) $< $(FUZZ_SRC) \
		$$(pkg-config --libs libevent libcrypto) -o $@

# each target runs FUZZ_SECONDS from its seed corpus (fastpath/fuzz/corpus*); new inputs it finds
# are kept in build/fuzz/ for the next run
fuzz: $(FUZZ_TARGETS:%=build/fuzz/fuzz_%)
	@mkdir -p build/fuzz/found-request build/fuzz/found-memcached
	build/fuzz/fuzz_request -max_total_time=$(FUZZ_SECONDS) -timeout=10 -max_len=16384 \
		build/fuzz/found-request fastpath/fuzz/corpus
	build/fuzz/fuzz_memcached -max_total_time=$(FUZZ_SECONDS) -timeout=10 -max_len=8192 \
		build/fuzz/found-memcached fastpath/fuzz/corpus-memcached

# the library distribution (docs/install.md): the sdist, the wheel built from it, and that wheel
# repaired by auditwheel: libevent and libcrypto copied into fastpoll.libs/ and the tag that
# auditwheel reports for this Debian 12 build instead of linux_x86_64 (glibc 2.36: Debian's
# libevent, copied in, calls arc4random)
AUDITWHEEL_PLAT ?= manylinux_2_36_x86_64
dist: $(STAMP)
	rm -rf dist build/wheel *.egg-info  # an old egg-info's SOURCES.txt would go into the sdist
	$(PY) -m build --outdir build/wheel .
	mkdir -p dist && mv build/wheel/*.tar.gz dist/
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/auditwheel repair --plat $(AUDITWHEEL_PLAT) -w dist build/wheel/*.whl
	rm -rf build/wheel
	@ls -l dist

test-sqlite: install
	$(PYTEST) $(PYTEST_ARGS) tests

test-postgres: install
	PLURK_TEST_POSTGRES=1 $(PYTEST) $(PYTEST_ARGS) tests/plurkcore tests/fastpoll

load: migrate
	$(PY) bench/load.py

# 10,000 polling users in locust's distributed mode (bench/load.py PRESET_10K); starts the stack
# unless one runs; writes bench/results/load-10k.json and .png, prints CPU/RSS per component.
load-10k: migrate
	$(PY) bench/load.py --preset 10k
	$(PY) bench/plot.py

bench: migrate bench-tools
	$(PY) bench/run_all.py

clean:
	rm -rf build dist *.egg-info fastpath/_server.c fastpath/_lifecycle.c fastpath/*.so fastpath/*.html $(EXT)
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) var
