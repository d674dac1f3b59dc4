#!/usr/bin/env bash
# The GPU verification script (issue 15): on a machine with an NVIDIA GPU, the CUDA toolkit and
# no package registry, it checks in one go what the CPU-only CI cannot, writing everything it
# prints to OUTDIR/gpu-check.log and its figures to OUTDIR/gpu-check.json.
#
#   scripts/gpu-check.sh prepare          on the development machine (Debian 12, nvcc): builds
#                                         with CUDA for any x86-64 CPU and packs the programs and
#                                         the Debian libraries they need into
#                                         build-gpu-carry/bundle.tar.xz (git-ignored, about 15 MB),
#                                         which is what travels to the GPU machine
#   scripts/gpu-check.sh run OUTDIR       on the GPU machine: unpacks that bundle (or builds
#                                         there when it is absent and the build dependencies are
#                                         installed), then runs every phase below
#
# Phases are functions, one per concern, each appending its figures to the JSON through
# `figure NAME VALUE`; a phase that fails is recorded and the others still run. The op harness
# (phase_ops) is the CUDA backend's; training, ZeRO and the benchmark phases follow it.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY="$ROOT/build-gpu-carry"   # bundle.tar.xz: bin/ and lib/ of the packed build
BUILD="$ROOT/build-gpu"         # where prepare (or run, without a bundle) builds
STAGE="$BUILD/bundle"           # what prepare packs

die() { echo "gpu-check: $*" >&2; exit 2; }

# ---- prepare (development machine) ------------------------------------------------------------

# The libraries a program needs that a bare machine with the CUDA toolkit lacks: everything ldd
# resolves except glibc's own, the compiler runtime's (the GPU machine's newer ones are backward
# compatible, and an older libstdc++ ahead of them would break its own programs) and the
# toolkit's (it has CUDA 13.0 itself).
bundle_libs() {
    ldd "$@" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
        case "$(basename "$lib")" in
        libc.so*|libm.so*|libmvec.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
        libstdc++.so*|libgcc_s.so*) ;;
        libcuda.so*|libcudart.so*|libcublas*.so*|libnccl.so*|libnvidia*) ;;
        *) cp -L "$lib" "$STAGE/lib/" ;;
        esac
    done
}

prepare() {
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die "prepare needs nvcc"
    export PATH=/usr/local/cuda/bin:$PATH
    # -DZT_NATIVE=OFF: the GPU machine's CPU may lack this one's instructions (AVX-512, AMX).
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DZT_NATIVE=OFF -DZT_CUDA=ON >/dev/null \
        || die "configure failed"
    nice cmake --build "$BUILD" -j2 --target test_ops test_cuda_host ztrain-worker ztrain \
        || die "build failed"
    rm -rf "$STAGE" "$CARRY" && mkdir -p "$STAGE/bin" "$STAGE/lib" "$CARRY"
    local progs=(test_ops test_cuda_host ztrain-worker ztrain)
    for p in "${progs[@]}"; do cp "$BUILD/$p" "$STAGE/bin/"; done
    # The CUDA backend is a module the programs load by name (kernels/backend.c): it goes to lib/,
    # which the run puts on LD_LIBRARY_PATH.
    cp "$BUILD/libztrain_cuda.so" "$STAGE/lib/" || die "no CUDA module in $BUILD"
    (cd "$STAGE/bin" && bundle_libs "${progs[@]}" ../lib/libztrain_cuda.so)
    # What the bundle was built from, for the run's report (uncommitted changes are marked).
    echo "$(git -C "$ROOT" rev-parse HEAD)$(git -C "$ROOT" diff --quiet HEAD || echo '+dirty')" \
        >"$STAGE/bin/COMMIT"
    tar -C "$STAGE" -cJf "$CARRY/bundle.tar.xz" bin lib || die "packing failed"
    du -sh "$CARRY/bundle.tar.xz"
}

# ---- run (GPU machine) ------------------------------------------------------------------------

OUT=""
FIGURES=()   # "name": value pairs of the JSON
FAILED=()

figure() { FIGURES+=("\"$1\": $2"); }
log() { echo "== $*"; }

# Runs a phase, recording its failure without stopping the others.
phase() {
    local name=$1; shift
    log "phase $name"
    local t0=$SECONDS
    if "$@"; then
        figure "${name}_ok" true
    else
        figure "${name}_ok" false
        FAILED+=("$name")
    fi
    figure "${name}_seconds" $((SECONDS - t0))
}

phase_device() {
    nvidia-smi || return 1
    local name
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    figure device "\"$name\""
    figure driver "\"$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)\""
    [ -n "$name" ]
}

# The programs: the carried bundle when there is one, else a build here (which needs the Debian
# build dependencies, scripts/install-deps.sh, and so a machine with a package registry).
phase_build() {
    if [ -f "$CARRY/bundle.tar.xz" ]; then
        # Unpacked outside OUTDIR, which should hold only what is worth bringing back.
        local dir
        dir=$(mktemp -d /tmp/ztrain-gpu-bundle.XXXXXX) && tar -C "$dir" -xJf "$CARRY/bundle.tar.xz" \
            || return 1
        BIN="$dir/bin"
        figure bundle_commit "\"$(cat "$BIN/COMMIT" 2>/dev/null || echo unknown)\""
        export LD_LIBRARY_PATH="$dir/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
        echo "using the carried build ($CARRY/bundle.tar.xz)"
        return 0
    fi
    export PATH=/usr/local/cuda/bin:$PATH
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DZT_CUDA=ON && \
        cmake --build "$BUILD" -j"$(nproc)" --target test_ops test_cuda_host ztrain-worker ztrain \
        || return 1
    BIN="$BUILD"
}

# The op test harness: every op of the CUDA backend against the CPU backend on the same inputs,
# forward and backward, at fp32 (1e-5 relative) and bf16 / fp16 (tests/unit/ops/harness.h's
# bounds), then the ops' timings at GPT-2 small's shapes.
phase_ops() {
    "$BIN/test_cuda_host" || return 1
    local log_ops="$OUT/test_ops.log"
    "$BIN/test_ops" 2>&1 | tee "$log_ops"
    local rc=${PIPESTATUS[0]}
    figure ops_failures "$(grep -c '^FAIL' "$log_ops")"
    grep -q 'backends: cpu cuda' "$log_ops" || { echo "the CUDA backend did not run"; return 1; }
    "$BIN/test_ops" --perf 2>&1 | tee "$OUT/test_ops_perf.log"
    return "$rc"
}

# Training on the GPU (tests/gpu/train_check.py): a GPT-2 and a Llama step against the CPU
# engine, 20 bf16 steps against the fp32 curve, ZeRO 1-3 with 2 ranks on one GPU against one
# rank, bit-exact resume, and ZeRO over NCCL when there are two GPUs. Its FIGURE lines become
# figures of the JSON.
phase_train() {
    local log_train="$OUT/train_check.log"
    timeout 300 python3 "$ROOT/tests/gpu/train_check.py" --bin "$BIN" --dir "$OUT/train-work" \
        2>&1 | tee "$log_train"
    local rc=${PIPESTATUS[0]}
    local name value
    while read -r _ name value; do figure "train_$name" "$value"; done \
        < <(grep '^FIGURE ' "$log_train")
    figure train_failures "$(grep -c '^FAIL' "$log_train")"
    rm -rf "$OUT/train-work"
    return "$rc"
}

# The benchmark (bench/bench_gpu.py): ztrain against PyTorch eager and torch.compile on GPT-2
# 124M, and the 1.1B Llama with and without offload; its JSON is kept beside this script's.
phase_bench() {
    timeout 330 python3 "$ROOT/bench/bench_gpu.py" --ztrain-bin "$BIN" --steps 20 --warmup 5 \
        --micro-batch 16 --out "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.log"
    local rc=${PIPESTATUS[0]}
    [ -f "$OUT/bench_gpu.json" ] && figure bench "$(cat "$OUT/bench_gpu.json")"
    return "$rc"
}

write_json() {
    local json="$OUT/gpu-check.json" i
    {
        echo "{"
        for i in "${!FIGURES[@]}"; do
            printf '  %s%s\n' "${FIGURES[$i]}" "$([ "$i" -lt $((${#FIGURES[@]} - 1)) ] && echo ,)"
        done
        echo "}"
    } >"$json"
}

run() {
    OUT=${1:?usage: gpu-check.sh run OUTDIR}
    mkdir -p "$OUT" || die "cannot create $OUT"
    OUT=$(cd "$OUT" && pwd)
    exec > >(tee "$OUT/gpu-check.log") 2>&1
    log "gpu-check $(date -u +%FT%TZ) in $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
    figure commit "\"$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)\""
    phase device phase_device
    phase build phase_build
    phase ops phase_ops
    phase train phase_train
    phase bench phase_bench
    figure failed_phases "\"${FAILED[*]:-}\""
    write_json
    log "done: ${#FAILED[@]} phase(s) failed${FAILED[*]:+: ${FAILED[*]}}"
    [ ${#FAILED[@]} -eq 0 ]
}

case "${1:-}" in
prepare) prepare ;;
run) shift; run "$@" ;;
*) echo "usage: gpu-check.sh prepare | run OUTDIR" >&2; exit 2 ;;
esac
