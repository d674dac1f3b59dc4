# Thin wrapper over CMake: the README's two commands.
#   make demo   installs the build profile only, trains a small GPT-2 on ztrain's own sources
#               through ztraind and prints a sample; from a terminal the daemon and its
#               dashboard stay up until Ctrl-C
#   make test   installs the test profile, builds everything and runs the test suite
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all build deps deps-build demo test test-sanitize test-fuzz test-container test-slurm test-soak bench
.PHONY: test-multihost test-deepspeed package test-package install
.PHONY: clean

all: build

deps:
	./scripts/install-deps.sh

# The demo needs the compiler and the libraries only: no PyTorch, browser or virtual environment.
deps-build:
	./scripts/install-deps.sh build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

demo: deps-build build
	./scripts/demo.sh $(BUILD)

test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: deps build
	/usr/bin/python3 bench/bench_cpu.py --build $(BUILD)

clean:
	rm -rf $(BUILD)

# Installing and packaging build the programs again, in a build directory of their own, the way
# a user's machine needs them rather than the way `make build` makes them for development: the
# CPU kernels for any x86-64 (ZT_NATIVE=OFF: -march=native would put this machine's instructions,
# AVX-512 say, everywhere and crash with SIGILL on an older CPU; the wider kernels stay, chosen
# at run time by CPUID), ztraind's default --web-dir where packaging/ installs the dashboard
# (ZT_WEB_DIR; a development build points at the checkout's web/), and no tests or emulated
# CUDA device (a test tool).
# tests/package/test_package.sh runs `make package`, so CI tests this very target.
INSTALL_FLAGS = -DCMAKE_BUILD_TYPE=Release -DZT_NATIVE=OFF -DZT_BUILD_TESTS=OFF -DZT_CUDA_EMU=OFF

# Installing (packaging/CMakeLists.txt says what goes where): PREFIX defaults to /usr/local, the
# build is build-install/. The CUDA module, when this machine has the toolkit, is built there
# too but installed only when asked: cmake --install build-install --component cuda.
PREFIX ?= /usr/local
INSTALL_BUILD ?= build-install
install:
	cmake -S . -B $(INSTALL_BUILD) $(INSTALL_FLAGS) -DCMAKE_INSTALL_PREFIX=$(PREFIX) \
	  -DZT_WEB_DIR=$(PREFIX)/share/ztrain/web
	cmake --build $(INSTALL_BUILD) -j $(JOBS)
	cmake --install $(INSTALL_BUILD) --prefix $(PREFIX)

# The Debian package, with CPack, built for /usr in build-package/ (no CUDA module: it links the
# CUDA toolkit's libraries, which no Debian package provides):
# build-package/ztrain_<version>_<arch>.deb.
PACKAGE_BUILD ?= build-package
package:
	cmake -S . -B $(PACKAGE_BUILD) $(INSTALL_FLAGS) -DZT_CUDA=OFF -DCMAKE_INSTALL_PREFIX=/usr \
	  -DZT_WEB_DIR=/usr/share/ztrain/web
	cmake --build $(PACKAGE_BUILD) -j $(JOBS)
	rm -f $(PACKAGE_BUILD)/ztrain_*.deb
	cd $(PACKAGE_BUILD) && cpack -G DEB

# `make package`'s .deb, its programs checked for instructions beyond x86-64's baseline outside
# the kernels chosen at run time, installed with apt into a fresh Debian root made with
# debootstrap, and the demo job and ztraind run there from the installed files
# (tests/package/test_package.sh; root, a Debian mirror; the root is kept for a week in
# /var/tmp/ztrain-package).
test-package:
	./scripts/install-deps.sh build container
	tests/package/test_package.sh $(JOBS)

# The unit, reference, CLI and service tests again under AddressSanitizer and
# UndefinedBehaviorSanitizer. Without the CUDA module (ZT_CUDA=OFF): nvcc does not instrument it
# and without a GPU it never runs, so building it here would only cost time; `make test` builds
# and packs it. Nor browser/ and docs/: they drive the same programs and endpoints as the
# service and CLI tests, through Chromium and the pages' commands, which is what they check, and
# took 189 of its 1,237 test-seconds.
test-sanitize: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZT_SANITIZE=ON -DZT_CUDA=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS) --exclude-regex '^(browser|docs)/'

# libFuzzer targets (tests/fuzz/: the DeepSpeed config, job specs, safetensors, token files,
# checkpoints' meta.json, ztraind's HTTP requests and gRPC request messages), built with clang
# under ASan/UBSan in build-fuzz/ and each run for FUZZ_SECONDS over its corpus, FUZZ_JOBS at a
# time (default one per core). A crash fails the run and keeps its input in
# build-fuzz/fuzz/crashes/ (tests/fuzz/run.sh).
FUZZ_SECONDS ?= 60
test-fuzz:
	./scripts/install-deps.sh build fuzz
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZT_FUZZ=ON
	cmake --build build-fuzz -j $(JOBS) --target fuzz
	FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh build-fuzz

# The CPU image from docker/Dockerfile, built with podman on a locally made Debian base and run:
# a job submitted from the host with $(BUILD)/ztrain, SIGTERM, a restart on the same volumes; then
# the CUDA image from docker/Dockerfile.cuda on the same base, built with this machine's CUDA
# toolkit mounted (skipped without one): a CPU job runs, a cuda job is refused without a GPU
# (tests/container/test_container.py; it installs podman, runc and debootstrap with apt).
test-container:
	./scripts/install-deps.sh build container
	$(MAKE) build
	/usr/bin/python3 tests/container/test_container.py $(BUILD)

# ztraind --launcher slurm on a Slurm cluster of two emulated nodes on this host (munged,
# slurmctld and two slurmd's started by the test, everything in a temporary directory; root):
# tests/slurm/test_slurm.py. It installs Slurm and munge with apt.
test-slurm:
	./scripts/install-deps.sh build slurm
	$(MAKE) build
	/usr/bin/python3 tests/slurm/test_slurm.py $(BUILD)

# Jobs whose ranks sit on two emulated hosts (network namespaces joined by veth links through a
# bridge, made and removed by the test; root): parity with one host at ZeRO 1 and 3 over the gloo
# transport, a killed host, a cut link and a missing rank, each named on every surviving rank
# (tests/multihost/test_multihost.py, about half a minute).
test-multihost:
	./scripts/install-deps.sh build multihost
	$(MAKE) build
	/usr/bin/python3 tests/multihost/test_multihost.py $(BUILD)

# The tests that need real DeepSpeed or transformers 5 (tests/deepspeed/, about three and a half
# minutes on 2 cores, most of it DeepSpeed compiling its CPU ops on first use, 333 CPU-seconds;
# it makes .venv-ds/ with PyPI's torch, DeepSpeed and transformers 5 the first time): ten masked SFT
# steps in DeepSpeed (CPU accelerator, two gloo ranks) and in ztrain on the same batches,
# directories transformers 5 writes read, trained and exported against transformers 5, and the
# Python client's batch-rule check and ztrain's "auto" batch keys against DeepSpeedConfig
# (and the Trainer's fill) on a grid of batch keys, and
# ztrain-worker under torch 2.x's torchrun command (static, c10d and standalone rendezvous); the
# suites run DS_JOBS at a time, default one per core (tests/deepspeed/run.sh).
test-deepspeed:
	./scripts/install-deps.sh build deepspeed
	$(MAKE) build
	tests/deepspeed/run.sh $(BUILD)

# ztraind under load and across faults (tests/soak/test_soak.py, about a minute on 2 cores): 200
# watchers on a running job while 1,000 jobs are submitted and listed, then 100 small jobs with
# the daemon SIGKILLed and restarted twice. It needs the service tests' packages.
test-soak:
	./scripts/install-deps.sh build test
	$(MAKE) build
	/usr/bin/python3 tests/soak/test_soak.py $(BUILD)
