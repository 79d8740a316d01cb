# Thin wrapper over CMake for the two commands of the README:
#   make demo   install deps if missing, build, serve the generated demo model
#   make test   install deps if missing, build, run every test, then all of
#               them again under AddressSanitizer + UBSan
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
DEMO_DIR   ?= demo-model
DEMO_FLAGS ?= --port 8000
CMAKE_FLAGS ?=

.PHONY: all deps build e2e-deps test asan demo clean

all: build

deps:
	@bash deploy/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

# The e2e suite's npm packages, exactly as package-lock.json pins them.
e2e-deps: deps
	@cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error

test: build e2e-deps
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory asan

# Every test again with AddressSanitizer + UndefinedBehaviorSanitizer (CPU only): the
# e2e tests then check that every process exits cleanly, leaks included.
asan: deps e2e-deps
	@cmake -S . -B $(ASAN_BUILD) -DVLMD_SANITIZE=address,undefined -DVLMD_CUDA=OFF \
		-DCMAKE_BUILD_TYPE=Debug >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) -- --no-print-directory
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

demo: build
	@$(BUILD)/bin/vlmd-make-demo-model $(DEMO_DIR)
	@echo "starting vlmd on the demo model in $(DEMO_DIR) (Ctrl-C stops it)"
	@exec $(BUILD)/bin/vlmd serve --model $(DEMO_DIR) $(DEMO_FLAGS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
