#!/usr/bin/env bash
# Installs what ztrain needs to build, test and benchmark on Debian 12, with apt. Idempotent: it
# installs only the packages that are missing and says which. Run as root (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake pkg-config            # the build
  libopenblas-openmp-dev                      # matmuls (the OpenMP build of OpenBLAS)
  libcjson-dev                                # JSON configs, job specs, metrics
  python3 python3-torch python3-numpy         # the PyTorch reference for tests and benchmarks
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler grpc-proto   # ztraind's gRPC (C core)
  libmicrohttpd-dev libsqlite3-dev            # ztraind's HTTP server and durable state
  python3-grpcio protobuf-compiler protobuf-compiler-grpc        # gRPC clients in the tests
  curl wrk                                    # the demo's HTTP call, the HTTP benchmark
  libjs-chart.js                              # the dashboard's charts, served by ztraind
  chromium chromium-driver python3-selenium   # the dashboard's browser tests
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages are installed"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
