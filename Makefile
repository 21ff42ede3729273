# GraphPipe: `make demo` and `make test` install what is missing, build, and run.
BUILD ?= build
JOBS ?= $(shell nproc)
GP := $(BUILD)/graphpipe

.PHONY: all deps configure build cli test demo bench paper soak multihost fidelity vs-torch clean test-asan test-tsan fuzz python zb-sim zb-plan zb-measure
.PHONY: format format-check tidy tidy-all ci

all: build

deps:
	@scripts/install-deps.sh

# WERROR=ON: warnings are errors in our code (GP_WERROR; LibTorch's headers are system includes and
# stay quiet). CI sets it (`make ci`); an existing build is reconfigured when WERROR names another value.
WERROR ?=

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(if $(WERROR),-DGP_WERROR=$(WERROR))

configure: deps $(BUILD)/build.ninja
	@if [ -n "$(WERROR)" ] && ! grep -qx 'GP_WERROR:BOOL=$(WERROR)' $(BUILD)/CMakeCache.txt; then \
	  cmake -DGP_WERROR=$(WERROR) $(BUILD); fi

# A first build compiles about 100 files, 20 of them LibTorch-heavy; nearly all of a first
# `make test` is this (docs/results-history.md, "Build time").
build: configure
	@echo "building everything in $(BUILD) (first build: ~10 min on 2 cores; later builds are incremental)"
	cmake --build $(BUILD) -j $(JOBS)

# The command-line tool alone (what demo, bench, paper and soak run): about half of the first build.
cli: configure
	@echo "building $(GP) (first build: ~5 min on 2 cores; later builds are incremental)"
	cmake --build $(BUILD) -j $(JOBS) --target graphpipe

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

demo: cli
	@scripts/demo.sh $(GP)

bench: cli
	@scripts/bench.sh $(BUILD)

paper: cli
	@scripts/paper.sh $(BUILD)

# Measured vs predicted iteration time on this machine: profile, plan at 1, 2, 4 devices (with the
# profile and with the calibrated cpu preset), train, compare (docs/results-history.md, "Fidelity").
fidelity: cli
	@scripts/fidelity.sh $(BUILD)

# Zero-bubble vs 1F1B simulated on the same plans (mmt, dlrm, candle-uno at 8 and 32 summit
# devices, mini-batch 128 and at the memory limit); writes the tables to $(BUILD)/zb-sim.md
# (docs/results.md, "Zero bubble"; under a minute).
zb-sim: cli
	@scripts/zb_sim_table.sh $(BUILD) > $(BUILD)/zb-sim.md && cat $(BUILD)/zb-sim.md

# Plans made for zb vs plans made for 1f1b (mmt, dlrm, candle-uno at 8 and 32 summit devices, at 16 GB
# and under a small-memory bound), each simulated under its own schedule; about 1 min
# (docs/results.md, "Zero-bubble plans").
zb-plan: cli
	@scripts/zb_plan_table.sh $(BUILD) > $(BUILD)/zb-plan.md && cat $(BUILD)/zb-plan.md

# Measured step time of 1f1b vs zb on this machine: one 2-stage plan trained with both schedules
# interleaved (docs/results.md, "Zero bubble in the runtime").
zb-measure: cli
	@scripts/zb_measure.sh $(BUILD)

# graphpipe train vs torch.distributed.pipelining on the same models, weights and data (2 CPU
# processes): losses must agree; median step times side by side in $(BUILD)/vs-torch.json (docs/vs-torch.md).
vs-torch: cli
	@scripts/vs-torch.sh $(BUILD)

# The Python package's tests alone (python/tests with pytest, as ctest python_package runs them);
# `pip install .` installs the package itself (docs/python.md).
python: cli
	GRAPHPIPE_BIN=$(abspath $(GP)) python3 -m pytest -q -p no:cacheprovider python/tests

# 500 steps on 4 workers with a crash and resume in the middle; final weights must be bit-identical.
soak: cli
	@GP=$(GP) scripts/soak.sh

# 24 SIGKILLs of a random worker or the launcher at random moments of a 3-stage run checkpointing
# every step; every attempt resumes and every loss equals the uninterrupted run's (docs/runtime.md).
crashtest: cli
	@GP=$(GP) scripts/crashtest.sh

# 2 and 3 hosts as network namespaces (root), torchrun-style ranks in each: losses equal --single on
# a clean, a delayed and a lossy network, a cut link then resume, rendezvous faults (docs/runtime.md).
multihost: cli
	@GP=$(GP) scripts/multihost.sh

# Sanitizer builds (docs/hardening.md). ASan+UBSan: every library and test except the LibTorch ones
# (runtime, profiler), Debug, any ASan/UBSan report fails the test.
SAN_LIBS := support;graph;ir;models;importers;cost;plan;planner;schedule;sim;cli
SAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
test-asan: deps
	cmake --preset asan -DGP_WITH_TORCH=OFF -DGP_LIBS="$(SAN_LIBS)" \
	  -DCMAKE_CXX_FLAGS="-fno-sanitize-recover=undefined"
	cmake --build build-asan -j $(JOBS)
	cd build-asan && $(SAN_ENV) ctest --output-on-failure -j $(JOBS) --timeout 900

# TSan: the runtime's thread-based tests (communicator, in-process pipeline: every rank a thread).
# LibTorch itself is not TSan-instrumented; tests/tsan.supp leaves races with a frame inside it
# unjudged (see docs/hardening.md for what this run does and does not prove). The multi-process
# tests are left out: TSan's start-up cost breaks their wall-clock bounds, not their logic.
TSAN_TESTS ?= DistComm|DistPipeline
test-tsan: deps
	cmake --preset tsan -DGP_WITH_TORCH=ON -DCMAKE_CXX_FLAGS="-fsanitize=thread -O1"
	cmake --build build-tsan -j $(JOBS) --target runtime_dist_test
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp \
	  ctest --output-on-failure -R '$(TSAN_TESTS)' --timeout 900

# libFuzzer targets (clang): each runs FUZZ_SECONDS on a scratch copy of fuzz/corpus/<target>.
FUZZ_SECONDS ?= 30
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) fuzz/run.sh

# The habits CI checks (README "Developing"): the C++ layout of .clang-format (clang-format 14),
# .clang-tidy's checks on the libraries without LibTorch, and `ci` = what .ci/run runs: the layout,
# then the build with warnings as errors and every test, then clang-tidy.
format-check: deps
	@scripts/format.sh check

format: deps
	@scripts/format.sh fix

tidy: configure
	@scripts/tidy.sh $(BUILD)

# Every library source without LibTorch (importers and cli too): about twice `make tidy`'s time.
tidy-all: configure
	@scripts/tidy.sh $(BUILD) all

ci:
	@.ci/run

clean:
	rm -rf $(BUILD)
