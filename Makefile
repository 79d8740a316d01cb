# Thin wrapper over CMake for the two commands of the README:
#   make demo   install deps if missing, build, serve the generated demo model
#   make test   install deps if missing, build, run every test, then all of
#               them again under AddressSanitizer + UBSan, then each fuzz
#               target for FUZZ_SECONDS
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
DEMO_DIR   ?= demo-model
DEMO_FLAGS ?= --port 8000
CMAKE_FLAGS ?=
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 30
FUZZ_TARGETS  = fuzz_proto fuzz_api_request fuzz_tokenizer fuzz_safetensors fuzz_image \
                fuzz_schema fuzz_grammar

.PHONY: all deps build e2e-deps test asan fuzz demo clean

all: build

deps:
	@bash deploy/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

# The e2e suite's npm packages, exactly as package-lock.json pins them. npm
# can stall on a registry request forever: each try is bounded, three tries.
e2e-deps: deps
	@cd tests/e2e && for try in 1 2 3; do \
		timeout 180 npm ci --no-audit --no-fund --loglevel=error && exit 0; \
		echo "npm ci failed or stalled (try $$try of 3)" >&2; sleep 5; \
	done; exit 1

test: build e2e-deps
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory asan
	@$(MAKE) --no-print-directory fuzz

# Every test again with AddressSanitizer + UndefinedBehaviorSanitizer (CPU only): the
# e2e tests then check that every process exits cleanly, leaks included.
asan: deps e2e-deps
	@cmake -S . -B $(ASAN_BUILD) -DVLMD_SANITIZE=address,undefined -DVLMD_CUDA=OFF \
		-DCMAKE_BUILD_TYPE=Debug >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) -- --no-print-directory
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

# Each libFuzzer target (clang, ASan + UBSan) for FUZZ_SECONDS from the seeds in
# tests/fuzz/corpus (new inputs go to a scratch directory, not the repository);
# a crash, a leak or a sanitizer report fails, with the input left in $(FUZZ_BUILD).
fuzz: deps
	@CC=clang cmake -S . -B $(FUZZ_BUILD) -DVLMD_FUZZ=ON -DVLMD_CUDA=OFF \
		-DVLMD_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(FUZZ_TARGETS) -- --no-print-directory
	@for t in $(FUZZ_TARGETS); do \
		scratch=$$(mktemp -d); \
		echo "fuzzing $$t for $(FUZZ_SECONDS) s"; \
		if ! $(FUZZ_BUILD)/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -timeout=10 \
			-artifact_prefix=$(FUZZ_BUILD)/$$t- -print_final_stats=1 $$scratch tests/fuzz/corpus/$$t \
			> $(FUZZ_BUILD)/$$t.log 2>&1; then \
			tail -60 $(FUZZ_BUILD)/$$t.log; rm -rf $$scratch; exit 1; \
		fi; \
		grep -h "stat::number_of_executed_units" $(FUZZ_BUILD)/$$t.log; \
		rm -rf $$scratch; \
	done

demo: build
	@$(BUILD)/bin/vlmd-make-demo-model $(DEMO_DIR)
	@echo "starting vlmd on the demo model in $(DEMO_DIR): once ready it prints the console's URL to open in a browser (Ctrl-C stops it)"
	@exec $(BUILD)/bin/vlmd serve --model $(DEMO_DIR) $(DEMO_FLAGS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
