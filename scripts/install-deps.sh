#!/usr/bin/env bash
# Installs what ztrain needs on Debian 12 with apt (the build and runtime profiles also on Ubuntu
# 24.04, the CUDA images' base). Idempotent: it installs only the packages that are missing and
# says which. Run as root (or with sudo available).
#
#   scripts/install-deps.sh              everything to build, test and benchmark (`make test`)
#   scripts/install-deps.sh PROFILE...   only the named profiles (several may be given):
#     build      compile ztraind, ztrain and ztrain-worker (the image's build stage)
#     runtime    run the built programs and serve the dashboard, nothing to compile with (the
#                image's runtime stage; it leaves apt's lists in place, the caller cleans them)
#     test       the test suite and benchmarks on top of build (PyTorch, grpcio, Chromium, ...)
#     fuzz       `make test-fuzz`: clang with libFuzzer's runtime and clang's OpenMP (on top of
#                build, whose libraries the fuzz build links)
#     container  `make test-container`: podman with runc, debootstrap, and python3 for the test
#     slurm      `make test-slurm`: Slurm's controller, node daemon and client tools, and munge
#     multihost  `make test-multihost`: iproute2 (network namespaces, veth, bridges) and the
#                test's PyTorch (it reads safetensors with it)
#     deepspeed  `make test-deepspeed`: the virtual environment .venv-ds/ with real DeepSpeed,
#                PyPI's torch and transformers 5 (scripts/requirements-deepspeed.txt)
set -euo pipefail

build=(
  build-essential cmake pkg-config            # the build
  libopenblas-openmp-dev                      # matmuls (the OpenMP build of OpenBLAS)
  libdnnl-dev                                 # matmuls on CPUs OpenBLAS does not know; bf16 (oneDNN)
  ocl-icd-opencl-dev                          # oneDNN's CMake config requires OpenCL (a Recommends)
  libcjson-dev                                # JSON configs, job specs, metrics
  libpcre2-dev                                # the tokenizers' pre-tokenizer regexes (UTF, UCP)
  libunistring-dev                            # the tokenizers' Unicode normalizers (NFC, NFKC)
  liburing-dev                                # io_uring for NVMe offload (else a thread pool)
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler grpc-proto   # ztraind's gRPC (C core)
  protobuf-compiler libprotobuf-dev           # the descriptor set for gRPC reflection, and the
                                              # well-known .protos (Any, Duration, descriptor)
  golang-github-gogo-googleapis-dev           # google/rpc/{status,error_details}.proto: errors
  libmicrohttpd-dev libsqlite3-dev            # ztraind's HTTP server and durable state
  libgnutls28-dev                             # TLS: checking certificates, client certificates
  libcurl4-openssl-dev                        # ztraind's webhook deliveries (HTTP/HTTPS POST)
  libssl-dev                                  # libcrypto: page tokens' HMAC-SHA256 and key
                                              # (linked directly, not only through curl)
  libjs-chart.js                              # the dashboard's charts, served by ztraind
  libgloo-dev                                 # the gloo transport: CPU ranks across hosts
  help2man                                    # man pages from the programs' --help
)

# The shared libraries the programs link (the -dev packages above name them), and Chart.js.
runtime=(
  libopenblas0-openmp libgomp1                # matmuls and the kernels' OpenMP threads
  libdnnl2                                    # matmuls through oneDNN (kernels/cpu/gemm.c)
  libcjson1 liburing2                         # JSON; io_uring (NVMe offload)
  libpcre2-8-0 libunistring2                  # the tokenizers' regexes and Unicode normalizers
  libgrpc29 libprotobuf-c1                    # gRPC C core (pulls in abseil, re2, c-ares, ssl)
  libmicrohttpd12 libsqlite3-0                # HTTP server, durable state
  libgnutls30                                 # TLS certificate checks (HTTPS's own library)
  libcurl4                                    # webhook deliveries
  libssl3                                     # libcrypto: signing page tokens
  libgloo0                                    # the gloo transport (ranks across hosts)
  libjs-chart.js                              # the dashboard's charts
  tini                                        # PID 1 in the image: reaps orphans, forwards signals
)

test=(
  python3 python3-torch python3-numpy         # the PyTorch reference for tests and benchmarks
  python3-grpcio protobuf-compiler protobuf-compiler-grpc        # gRPC clients in the tests
  python3-yaml                                # the Kubernetes manifest's test reads it
  curl wrk                                    # the demo's HTTP call, the HTTP benchmark
  zsh                                         # the CLI test parses `ztrain completion zsh`
  openssl                                     # the TLS test makes its certificates
  chromium chromium-driver python3-selenium   # the dashboard's browser tests
  python3-venv python3-pip                    # .venv/: the PyPI packages a few tests compare with
)

# The fuzz build (`make test-fuzz`): clang, libclang_rt.fuzzer and the sanitizers' runtimes
# (libclang-rt-dev: the distribution's clang version of libclang-rt-14-dev on Debian 12), and
# the OpenMP runtime that clang's -fopenmp links (GCC's libgomp is not clang's).
fuzz=(
  clang libclang-rt-dev libomp-dev
)

# podman pulls in crun first, which rejects hybrid cgroup hosts, so runc is named; netavark is
# the network stack (apt would otherwise pick the older CNI plugins without recommends), and it
# needs iptables for published ports and the bridge's NAT.
container=(
  podman runc netavark iptables               # build and run OCI images, no daemon
  debootstrap                                 # the Debian base image, made locally
  python3                                     # the container test
)

# A Slurm cluster of two emulated nodes on this host, for the Slurm launcher's test (the
# controller, the node daemon, srun/scancel/squeue/scontrol, and munge for authentication).
slurm=(
  slurmctld slurmd slurm-client munge         # Slurm 22.05 and its authentication
  python3 python3-grpcio protobuf-compiler protobuf-compiler-grpc   # the test's gRPC client
)

# Emulated hosts for the multi-host test: network namespaces joined by veth links and a bridge.
multihost=(
  iproute2                                    # ip netns, veth, bridge
  python3 python3-torch                       # the test, and its safetensors reader
)

# Real DeepSpeed's environment (.venv-ds/, below) is made with Debian's python3.
deepspeed=(
  python3 python3-venv python3-pip
)

profiles=("$@")
if [ ${#profiles[@]} -eq 0 ]; then profiles=(build test); fi
packages=()
for profile in "${profiles[@]}"; do
  case "$profile" in
    build) packages+=("${build[@]}") ;;
    runtime) packages+=("${runtime[@]}") ;;
    test) packages+=("${build[@]}" "${test[@]}") ;;
    fuzz) packages+=("${build[@]}" "${fuzz[@]}") ;;
    container) packages+=("${container[@]}") ;;
    slurm) packages+=("${slurm[@]}") ;;
    multihost) packages+=("${multihost[@]}") ;;
    deepspeed) packages+=("${deepspeed[@]}") ;;
    *) echo "install-deps: unknown profile '$profile' (build, runtime, test, fuzz, container, slurm, multihost, deepspeed)" >&2
       exit 2 ;;
  esac
done

# Ubuntu 24.04 (the CUDA images' base) has the same versions under other names for three of the
# runtime libraries: its 64-bit time_t transition renamed them; and a newer libunistring. Its
# oneDNN is not the 2.x API the CPU kernels use, so the build there takes OpenBLAS alone.
os_id="$(. /etc/os-release 2>/dev/null && echo "${ID:-}")"
if [ "$os_id" = ubuntu ]; then
  for i in "${!packages[@]}"; do
    case "${packages[$i]}" in
      libgrpc29|libmicrohttpd12|libgnutls30) packages[$i]="${packages[$i]}t64" ;;
      libunistring2) packages[$i]=libunistring5 ;;
      libdnnl-dev|libdnnl2) unset 'packages[i]' ;;
    esac
  done
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    case " ${missing[*]} " in *" $p "*) ;; *) missing+=("$p") ;; esac
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps (${profiles[*]}): all packages are installed"
else
  echo "install-deps (${profiles[*]}): installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  echo "install-deps: done"
fi

# The test profile's PyPI packages (scripts/requirements-test.txt) in .venv/ at the repository
# root, built on Debian's python3 with its site packages visible. Remade only when the
# requirements change: the copy of them inside .venv/ records what was installed.
case " ${profiles[*]} " in
  *" test "*)
    root="$(cd "$(dirname "$0")/.." && pwd)"
    req="$root/scripts/requirements-test.txt"
    venv="$root/.venv"
    if ! cmp -s "$req" "$venv/requirements-test.txt" 2>/dev/null; then
      echo "install-deps (test): installing scripts/requirements-test.txt into .venv/"
      rm -rf "$venv"
      /usr/bin/python3 -m venv --system-site-packages "$venv"
      "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
      cp "$req" "$venv/requirements-test.txt"
    fi
    ;;
esac

# The deepspeed profile's environment .venv-ds/ (scripts/requirements-deepspeed.txt), without
# Debian's site packages (their torch 1.13 would shadow PyPI's). Remade only when the
# requirements change, as .venv/ is.
case " ${profiles[*]} " in
  *" deepspeed "*)
    root="$(cd "$(dirname "$0")/.." && pwd)"
    req="$root/scripts/requirements-deepspeed.txt"
    venv="$root/.venv-ds"
    if ! cmp -s "$req" "$venv/requirements-deepspeed.txt" 2>/dev/null; then
      echo "install-deps (deepspeed): installing scripts/requirements-deepspeed.txt into .venv-ds/"
      rm -rf "$venv"
      /usr/bin/python3 -m venv "$venv"
      "$venv/bin/pip" install -q --disable-pip-version-check "$(grep -o '^torch==[^ ]*' "$req")"
      DS_BUILD_OPS=0 "$venv/bin/pip" install -q --disable-pip-version-check \
        --no-build-isolation -r "$req"
      cp "$req" "$venv/requirements-deepspeed.txt"
    fi
    ;;
esac
