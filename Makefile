# GraphPipe: `make demo` and `make test` install what is missing, build, and run.
BUILD ?= build
JOBS ?= $(shell nproc)
GP := $(BUILD)/graphpipe

.PHONY: all deps configure build test demo bench paper clean test-asan test-tsan fuzz

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

demo: build
	@scripts/demo.sh $(GP)

bench: build
	@scripts/bench.sh $(BUILD)

paper: build
	@scripts/paper.sh $(BUILD)

# Sanitizer builds (docs/hardening.md). ASan+UBSan: every library and test except the LibTorch ones
# (runtime, profiler), Debug, any ASan/UBSan report fails the test.
SAN_LIBS := support;graph;ir;models;importers;cost;plan;planner;schedule;sim;cli
SAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
test-asan: deps
	cmake --preset asan -DGP_WITH_TORCH=OFF -DGP_LIBS="$(SAN_LIBS)" \
	  -DCMAKE_CXX_FLAGS="-fno-sanitize-recover=undefined"
	cmake --build build-asan -j $(JOBS)
	cd build-asan && $(SAN_ENV) ctest --output-on-failure -j $(JOBS) --timeout 900

# TSan: the runtime's thread-based tests (communicator, in-process pipeline). LibTorch itself is
# not TSan-instrumented, so races inside it are invisible and its own synchronisation can be
# reported falsely; see docs/hardening.md for what this run does and does not prove.
TSAN_TESTS ?= DistComm|DistPipeline
test-tsan: deps
	cmake --preset tsan -DGP_WITH_TORCH=ON
	cmake --build build-tsan -j $(JOBS) --target runtime_dist_test
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -R '$(TSAN_TESTS)' --timeout 900

# libFuzzer targets (clang): each runs FUZZ_SECONDS on a scratch copy of fuzz/corpus/<target>.
FUZZ_SECONDS ?= 30
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) fuzz/run.sh

clean:
	rm -rf $(BUILD)
