#!/usr/bin/env bash
# The GPU verification script: on a machine with an NVIDIA GPU and no package registry, it checks
# what the CPU-only CI cannot, writing everything it prints to OUTDIR/gpu-check.log and its
# figures to OUTDIR/gpu-check.json (docs/gpu.md, "Running the GPU check", says how to read it).
#
#   scripts/gpu-check.sh prepare          on the development machine (Debian 12, nvcc): builds
#                                         with CUDA for any x86-64 CPU, then packs it (below);
#                                         with LLMC_SRC (and CUDNN_FRONTEND_SRC) llm.c too
#   scripts/gpu-check.sh pack [BUILD [DEST]]
#                                         packs the programs of BUILD (default build-gpu), the CUDA
#                                         module, the CUDA runtime and the Debian libraries they
#                                         need into DEST/bundle.tar.xz (default build-gpu-carry/,
#                                         git-ignored, well under the 64 MiB a GPU machine takes)
#   scripts/gpu-check.sh unpack           unpacks the bundle as run does and prints BIN=, the
#                                         folder of wrappers that run its programs by hand (its
#                                         parent folder is left for the caller to remove)
#   scripts/gpu-check.sh run OUTDIR [--phases LIST] [--budget SECONDS]
#                                         on the GPU machine: unpacks the carried bundle (it stops
#                                         at once without one: nothing is built there), runs the
#                                         phases LIST names (default ZT_GPU_PHASES, else the
#                                         default plan) within SECONDS (default ZT_GPU_BUDGET,
#                                         else 540), and removes the unpacked bundle at the end
#   scripts/gpu-check.sh plan [--phases LIST] [--budget SECONDS]
#                                         prints the phases run would run and their time limits
#
# A GPU is lent for minutes: 15 of device time in all, start-up included, at most 600 s a
# command (../shared/reference/toolchain.md, the device tool). The phases run in the order of
# PHASES below: the ops and a training curve against the CPU, then the first tokens/s beside
# llm.c's and PyTorch's, then the rest. The default plan is every phase but
# `bench` and `ops_perf` (PLAN_DEFAULT: 530 s of limits, within the 540 s budget that leaves a
# 600 s command a minute); the second command, with the device time left, is
#   scripts/gpu-check.sh run OUTDIR2 --phases bench,ops_perf --budget SECONDS
# `device` and `bundle` run in every plan. Every phase has its own time limit, cut to what is
# left of the budget; a phase with less than PHASE_MIN seconds left is skipped, saying so. The
# JSON is rewritten as each phase ends, so a run cut short still returns what it measured. A
# failure is recorded as PHASE_error, naming the phase, the op or step, and the device's message.
# OUTDIR holds five files at most (the device tool brings back eight): the JSON, the log of
# everything printed, written as it is printed, logs.tar.gz (each phase's and each tool's own
# log, packed again as each phase ends) and the profile phase's profile-gpt2.json and
# perf_model.md.
# The `train` phase's NCCL check needs two GPUs: on a one-GPU machine it says "skip nccl".
#
# The bundle carries libcudart (small, redistributable) but not cuBLASLt (540 MB), NCCL (220 MB;
# xz leaves 187 MB) or cuDNN, which the run finds on the machine: the CUDA toolkit's directories,
# the environment's LD_LIBRARY_PATH, the linker's cache, or the nvidia-* wheels PyTorch brings.
# The bundle's libraries reach only ztrain's programs (through the wrappers in wrap/), never the
# Python that runs PyTorch.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY="${ZT_GPU_CARRY:-$ROOT/build-gpu-carry}"   # bundle.tar.xz: bin/, lib/, the build's facts
BUILD="$ROOT/build-gpu"         # where prepare builds
PROGS=(test_ops test_cuda_host ztrain-worker ztrain)
# What the GPU machine must supply itself: the driver, and the toolkit libraries too large to carry.
MACHINE_LIBS="libcuda.so.1 libcublasLt.so.13 libcublas.so.13 libnccl.so.2"
# What ztrain's programs use when the machine has it: cuDNN's fused attention (dlopen'ed by the
# CUDA module, kernels/cuda/attention/cudnn_sdpa_graph.c, which falls back to the flash kernel
# without it) and NVRTC, which cuDNN's runtime-compiled engines load. The ops phase fails when
# cuDNN is missing, since checking its attention is part of that phase's point.
ATTENTION_LIBS="libcudnn.so.9 libnvrtc.so.13"
# The phases in the order they run, most answer per second first, and each one's time limit
# (docs/gpu.md's table, which tests/cli/test_gpu_bundle.py compares with `plan`).
PHASES=(device bundle ops curve throughput train profile bench ops_perf)
declare -A PHASE_LIMIT=([device]=15 [bundle]=20 [ops]=60 [curve]=45 [train]=240 [throughput]=90
                        [profile]=60 [bench]=240 [ops_perf]=60)
PLAN_DEFAULT=ops,curve,throughput,train,profile     # and device, bundle: 530 s of limits
BUDGET_DEFAULT=540              # seconds: the device tool's 600 s a command, less a minute
PHASE_MIN=10                    # seconds: a phase left less is skipped
STEP_MIN=5                      # seconds: a phase's step left less is skipped
# Seconds one run of a training check or of the throughput phase may take (train_check.py's and
# bench_gpu.py's --timeout; a GPU runs each in seconds): one that hangs fails itself, not every
# check or run after it in the phase.
RUN_LIMIT=${ZT_GPU_RUN_LIMIT:-60}
# llm.c, the benchmark's reference (bench_gpu.py's llmc run): a checkout or git directory of
# github.com/karpathy/llm.c, and of github.com/NVIDIA/cudnn-frontend for its cuDNN attention
# (llm.c's USE_CUDNN=1 build), each taken at its HEAD; fetched by whoever prepares, carried in
# the bundle, never committed. Without LLMC_SRC the bundle has no llm.c and the llmc run says so.
LLMC_SRC=${LLMC_SRC:-}
CUDNN_FRONTEND_SRC=${CUDNN_FRONTEND_SRC:-}
LLMC_LIBS="libcudnn.so.9 libnvrtc.so.13" # what llm.c's cuDNN build needs of the machine

die() { echo "gpu-check: $*" >&2; exit 2; }

# ---- prepare and pack (development machine) ---------------------------------------------------

# The libraries the programs need that a bare machine lacks: everything ldd resolves except
# glibc's own and the compiler runtime's (the GPU machine's newer ones are backward compatible, and
# an older libstdc++ ahead of them would break its own programs), and except what the machine
# supplies (MACHINE_LIBS).
bundle_libs() {
    local stage=$1; shift
    ldd "$@" | awk '/=> \//{print $1, $3}' | sort -u | while read -r name lib; do
        case "$name" in
        libc.so*|libm.so*|libmvec.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
        libstdc++.so*|libgcc_s.so*) ;;
        libcuda.so*|libcublas*.so*|libnccl.so*|libnvidia*|libcudnn*.so*|libnvrtc*.so*) ;;
        *) cp -L "$lib" "$stage/lib/" ;;
        esac
    done
}

pack() {
    local build=${1:-$BUILD} dest=${2:-$CARRY}
    build=$(cd "$build" && pwd) || die "no build directory $1"
    local stage
    stage=$(mktemp -d /tmp/ztrain-gpu-pack.XXXXXX) || die "no temporary directory"
    mkdir -p "$stage/bin" "$stage/lib" "$dest" || die "cannot create $dest"
    for p in "${PROGS[@]}"; do
        cp "$build/$p" "$stage/bin/" || die "no $p in $build (build it first)"
    done
    # The CUDA backend is a module the programs load by name (kernels/backend.c): it goes to lib/,
    # which the wrappers put on LD_LIBRARY_PATH.
    cp "$build/libztrain_cuda.so" "$stage/lib/" || die "no CUDA module in $build"
    build_llmc "$stage"
    local llmc=("$stage"/bin/llmc_*)
    [ -e "${llmc[0]}" ] || llmc=()
    bundle_libs "$stage" "${PROGS[@]/#/$stage/bin/}" "${llmc[@]}" "$stage/lib/libztrain_cuda.so"
    # What the bundle was built from, for the run's report (uncommitted changes are marked).
    echo "$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff \
        --quiet HEAD 2>/dev/null || echo '+dirty')" >"$stage/bin/COMMIT"
    local nvcc
    nvcc=$(grep -m1 '^CMAKE_CUDA_COMPILER:' "$build/CMakeCache.txt" 2>/dev/null | cut -d= -f2)
    "${nvcc:-nvcc}" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\),.*/\1/p' \
        >"$stage/bin/CUDA_VERSION"
    # xz -1: 27 MB in 8 s on one core, where xz's default -6 took 47 s for 21 MB.
    tar -C "$stage" --use-compress-program='xz -1' -cf "$dest/bundle.tar.xz" bin lib \
        || die "packing failed"
    rm -rf "$stage"
    du -sh "$dest/bundle.tar.xz"
}

# SRC's committed HEAD (a work tree or a git directory) or, not under git, its files: the PATHS of
# it into DEST.
copy_tree() {
    local src=$1 dest=$2; shift 2
    mkdir -p "$dest" || return 1
    if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
        git -C "$src" archive HEAD "$@" | tar -x -C "$dest"
    else
        (cd "$src" && cp -r "$@" "$dest/")
    fi
}
rev_of() { git -C "$1" rev-parse --short HEAD 2>/dev/null || echo "not under git"; }

# llm.c's train_gpt2cu into STAGE/bin/llmc_train_gpt2cu as its Makefile builds it for one GPU
# (bf16, fp32 master weights: its defaults), for sm_90 (H100, H200), with cuDNN's attention when
# CUDNN_FRONTEND_SRC is given, and then also without it (llmc_train_gpt2cu_nocudnn, llm.c's own
# attention kernels), which the benchmark runs if the cuDNN build fails on the GPU machine's
# cuDNN; bin/LLMC says from what. Nothing without LLMC_SRC.
build_llmc() {
    local stage=$1 work cudnn=none
    if [ -z "$LLMC_SRC" ]; then
        echo "llm.c: not built (LLMC_SRC: a checkout or git directory of karpathy/llm.c)"
        return 0
    fi
    work=$(mktemp -d /tmp/ztrain-llmc.XXXXXX) || die "no temporary directory"
    copy_tree "$LLMC_SRC" "$work/src" train_gpt2.cu llmc || die "llm.c: cannot read $LLMC_SRC"
    # CUDA 13's cudaMemAdvise takes a cudaMemLocation where CUDA 12's took a device number: the
    # one such call llm.c makes (cudaCpuDeviceId) is rewritten as CUDA 13 spells it.
    local advise=cudaMemAdviseSetPreferredLocation
    sed -i "s/$advise, cudaCpuDeviceId)/$advise, cudaMemLocation{cudaMemLocationTypeHost, 0})/" \
        "$work/src/llmc/cuda_utils.cuh"
    local base=(--threads=0 -t=0 --use_fast_math -std=c++17 -O3
                -gencode arch=compute_90,code=sm_90 -DENABLE_BF16)
    local flags=("${base[@]}") objs=() libs=(-lcublas -lcublasLt)
    if [ -n "$CUDNN_FRONTEND_SRC" ]; then
        copy_tree "$CUDNN_FRONTEND_SRC" "$work/fe" include \
            || die "llm.c: cannot read cudnn-frontend at $CUDNN_FRONTEND_SRC"
        flags+=(-DENABLE_CUDNN -I"$work/fe/include")
        nice nvcc "${flags[@]}" -c "$work/src/llmc/cudnn_att.cpp" -o "$work/cudnn_att.o" \
            || die "llm.c: building its cuDNN attention failed"
        objs=("$work/cudnn_att.o")
        # The frontend compiles some kernels at run time (NVRTC) and loads them (the driver).
        libs+=(-lcudnn -lnvrtc -L/usr/local/cuda/lib64/stubs -lcuda)
        cudnn=$(rev_of "$CUDNN_FRONTEND_SRC")
    fi
    (cd "$work/src" && nice nvcc "${flags[@]}" train_gpt2.cu "${objs[@]}" "${libs[@]}" \
        -o "$stage/bin/llmc_train_gpt2cu") || die "llm.c: build failed"
    if [ -n "$CUDNN_FRONTEND_SRC" ]; then
        (cd "$work/src" && nice nvcc "${base[@]}" train_gpt2.cu -lcublas -lcublasLt \
            -o "$stage/bin/llmc_train_gpt2cu_nocudnn") \
            || die "llm.c: build without cuDNN failed"
    fi
    echo "llm.c $(rev_of "$LLMC_SRC"), cudnn-frontend $cudnn, bf16, sm_90" >"$stage/bin/LLMC"
    cat "$stage/bin/LLMC"
    rm -rf "$work"
}

prepare() {
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die "prepare needs nvcc"
    export PATH=/usr/local/cuda/bin:$PATH
    # -DZT_NATIVE=OFF: the GPU machine's CPU may lack this one's instructions (AVX-512, AMX).
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DZT_NATIVE=OFF -DZT_CUDA=ON >/dev/null \
        || die "configure failed"
    nice cmake --build "$BUILD" -j2 --target "${PROGS[@]}" || die "build failed"
    pack "$BUILD" "$CARRY"
}

# ---- run (GPU machine) ------------------------------------------------------------------------

OUT=""
SCRATCH=""   # the run's folder outside OUT: LOGS and the training checks' work, removed at the end
LOGS=""      # each phase's and each tool's log and JSON, packed into OUT/logs.tar.gz
FIGURES=()   # "name": value pairs of the JSON, in the order measured
FAILED=()
SKIP_GPU=""  # why the GPU phases cannot run ("" while they can)
BUNDLE_DIR=""  # where the bundle was unpacked, removed when run ends

json_str() {  # a JSON string of $1: backslashes, quotes and control characters escaped
    printf '"%s"' "$(printf '%s' "$1" | tr -d '\000-\010\013-\037' | sed -e 's/\\/\\\\/g' \
        -e 's/"/\\"/g' | awk 'NR > 1 {printf "\\n"} {printf "%s", $0}')"
}
figure() { FIGURES+=("\"$1\": $2"); }
log() { echo "== $*"; }

# LOGS packed into OUT/logs.tar.gz, replacing the last packing whole: OUT keeps its few files
# (the device tool brings back eight) however many logs the phases write.
pack_logs() {
    [ -n "$LOGS" ] && [ -d "$LOGS" ] || return 0
    tar -C "$LOGS" -czf "$OUT/logs.tar.gz.tmp" . && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}

write_json() {
    local json="$OUT/gpu-check.json" i
    {
        echo "{"
        for i in "${!FIGURES[@]}"; do
            printf '  %s%s\n' "${FIGURES[$i]}" "$([ "$i" -lt $((${#FIGURES[@]} - 1)) ] && echo ,)"
        done
        echo "}"
    } >"$json.tmp" && mv "$json.tmp" "$json"
}

# The running phase's output (its tee's pipe), closed when it ends or the run does, or that tee
# and the log's would wait for it forever.
PHASE_FD=""
INTERRUPTED=""  # set when the run is stopped (INT, TERM)
close_phase_fd() {
    [ -z "$PHASE_FD" ] || exec {PHASE_FD}>&-
    PHASE_FD=""
}

# Runs phase NAME within LIMIT seconds, cut to what is left of the run's budget: records NAME_ok,
# NAME_seconds and, on failure, NAME_error (the phase's own message in PHASE_WHY, else its log's
# last line), then rewrites the JSON. A GPU phase after a failed device phase is skipped, and so
# is a phase left less than PHASE_MIN seconds, saying why.
phase() {
    local name=$1 limit=$2; shift 2
    local left=$((BUDGET - (SECONDS - RUN_T0)))
    [ "$left" -lt "$limit" ] && limit=$left
    local skip=$SKIP_GPU
    [ "$name" = device ] && skip=""
    [ -z "$skip" ] && [ "$limit" -lt "$PHASE_MIN" ] \
        && skip="no time left: ${left} s of the run's $BUDGET s budget (--budget)"
    if [ -n "$skip" ]; then
        log "phase $name"
        figure "${name}_ok" null
        figure "${name}_error" "$(json_str "phase $name: skipped: $skip")"
        echo "skipped: $skip"
        write_json
        return
    fi
    log "phase $name (at most ${limit} s)"
    PHASE_WHY=""
    local t0=$SECONDS rc
    # Printed as it is printed, into gpu-check.log, so that a run killed in this phase still
    # brings back its output; not through a pipe, which would run the phase in a subshell and
    # lose what it records.
    local tee_pid
    exec {PHASE_FD}> >(tee "$LOGS/phase-$name.log")
    tee_pid=$!
    "$@" "$limit" >&"$PHASE_FD" 2>&1
    rc=$?
    close_phase_fd
    wait "$tee_pid"  # for tee to write the phase's last lines
    if [ "$rc" -eq 0 ]; then
        figure "${name}_ok" true
    else
        local why=$PHASE_WHY
        [ -z "$why" ] && [ "$rc" -eq 124 ] && why="timed out after $limit s"
        [ -n "$why" ] || why=$(grep -v '^\s*$' "$LOGS/phase-$name.log" | tail -1)
        figure "${name}_ok" false
        figure "${name}_error" "$(json_str "phase $name: ${why:-exit $rc}")"
        echo "gpu-check: phase $name failed: ${why:-exit $rc}"
        FAILED+=("$name")
    fi
    figure "${name}_seconds" $((SECONDS - t0))
    write_json
    pack_logs
}

# Runs a command within LIMIT seconds, its output in LOGF. The phase's first failing step sets
# PHASE_WHY (its first FAIL line, its timeout, or its last line), which later steps leave as it is.
# A step left less than STEP_MIN seconds is not started (GNU timeout takes 0 for no limit and a
# negative number for an option): LOGF says so, the step joins SKIPPED_STEPS, and it returns 124.
SKIPPED_STEPS=()
STEP_PIDS=()  # the running step's timeout and tail, which a stopped run stops too
bounded() {
    local limit=$1 logf=$2; shift 2
    local step
    step=$(basename "$logf" .log)
    if [ "$limit" -lt "$STEP_MIN" ]; then
        echo "gpu-check: $step skipped: ${limit} s left of the phase" | tee "$logf"
        SKIPPED_STEPS+=("$step")
        [ -n "$PHASE_WHY" ] || PHASE_WHY="$step skipped: ${limit} s left of the phase"
        return 124
    fi
    # Into LOGF, and printed as it is written (tail until timeout exits): a pipe to tee would
    # wait for whatever process still held it open, the step's time limit or not; for the same
    # reason the step does not get the phase's pipe (PHASE_FD).
    : >"$logf"  # there before tail looks for it
    timeout --kill-after=5 "$limit" "$@" >>"$logf" 2>&1 {PHASE_FD}>&- &
    local pid=$!
    tail -n +1 -f --pid="$pid" "$logf" 2>/dev/null &
    local tailer=$! rc
    STEP_PIDS=("$pid" "$tailer")
    wait "$pid"
    rc=$?
    wait "$tailer"
    STEP_PIDS=()
    if [ "$rc" -ne 0 ] && [ -z "$PHASE_WHY" ]; then
        PHASE_WHY=$(grep -m1 '^FAIL' "$logf" || grep -v '^\s*$' "$logf" | tail -1)
        [ "$rc" -eq 124 ] && PHASE_WHY="$step timed out after $limit s (${PHASE_WHY:-no output})"
    fi
    return "$rc"
}
# A stopped run's step: timeout passes the signal on to the step's command.
stop_step() {
    [ ${#STEP_PIDS[@]} -eq 0 ] || kill "${STEP_PIDS[@]}" 2>/dev/null
    STEP_PIDS=()
}
# The FAIL lines of a step's log, or null when the step was not started.
failures() {
    if [ ! -f "$1" ] || grep -q '^gpu-check: .* skipped: ' "$1"; then echo null
    else grep -c '^FAIL' "$1"; fi
}

# The driver and the device. A CUDA 13 build needs an R580 or newer driver; an older one makes
# every CUDA call fail with cudaErrorInsufficientDriver, which is said here with both versions.
phase_device() {
    command -v nvidia-smi >/dev/null || { PHASE_WHY="no nvidia-smi: no NVIDIA driver here"; \
        SKIP_GPU="no NVIDIA driver (nvidia-smi is missing)"; return 1; }
    local q name driver limit=$1
    q=$(timeout -k 5 "$limit" nvidia-smi --query-gpu=name,driver_version,memory.total \
        --format=csv,noheader)
    if [ -z "$q" ]; then
        PHASE_WHY="nvidia-smi lists no GPU: $(timeout -k 5 "$limit" nvidia-smi 2>&1 | tail -1)"
        SKIP_GPU="no GPU visible"
        return 1
    fi
    echo "$q"
    name=$(echo "$q" | head -1 | cut -d, -f1 | sed 's/^ *//')
    driver=$(echo "$q" | head -1 | cut -d, -f2 | tr -d ' ')
    figure device "$(json_str "$name")"
    figure driver "$(json_str "$driver")"
    figure gpus "$(echo "$q" | wc -l)"
    local cuda=${BUNDLE_CUDA:-13} need=0
    case "${cuda%%.*}" in 13) need=580 ;; 12) need=525 ;; esac
    if [ "$need" -gt 0 ] && [ "${driver%%.*}" -lt "$need" ]; then
        PHASE_WHY="driver $driver is older than R$need, which this CUDA $cuda build needs: every \
CUDA call would fail with cudaErrorInsufficientDriver"
        SKIP_GPU=$PHASE_WHY
        return 1
    fi
}

# A library the machine must supply, from the toolkit, the environment's LD_LIBRARY_PATH (which
# the wrappers keep, and where an image may keep its CUDA libraries), the linker's cache or
# PyTorch's wheels.
find_machine_lib() {
    local name=$1 d env_dirs
    IFS=: read -ra env_dirs <<<"${LD_LIBRARY_PATH:-}"
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib \
             "${env_dirs[@]}"; do
        [ -n "$d" ] && [ -e "$d/$name" ] && { echo "$d"; return 0; }
    done
    # The cache may name a file since removed or hidden.
    d=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n {print $NF; exit}')
    [ -n "$d" ] && [ -e "$d" ] && { dirname "$d"; return 0; }
    for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
        local hit
        hit=$(ls "$d"/nvidia/*/lib/"$name" 2>/dev/null | head -1)
        [ -n "$hit" ] && { dirname "$hit"; return 0; }
    done
    return 1
}

# The programs: the carried bundle, unpacked outside OUTDIR (which should hold only what is worth
# bringing back), behind wrappers that give only them the bundle's libraries and the machine's
# (MACHINE_LIBS, and ATTENTION_LIBS where it has them).
phase_bundle() {
    [ -f "$CARRY/bundle.tar.xz" ] || { PHASE_WHY=$(no_bundle); SKIP_GPU=$PHASE_WHY; return 1; }
    local dir libs="" name d missing=""
    dir=$(mktemp -d "${TMPDIR:-/tmp}/ztrain-gpu-bundle.XXXXXX") \
        || { PHASE_WHY="no temporary directory"; return 1; }
    BUNDLE_DIR=$dir
    tar -C "$dir" -xJf "$CARRY/bundle.tar.xz" \
        || { PHASE_WHY="cannot unpack $CARRY/bundle.tar.xz"; return 1; }
    figure bundle_commit "$(json_str "$(cat "$dir/bin/COMMIT" 2>/dev/null || echo unknown)")"
    figure bundle_cuda "$(json_str "${BUNDLE_CUDA:-unknown}")"
    for name in $MACHINE_LIBS; do
        [ "$name" = libcuda.so.1 ] && continue
        if d=$(find_machine_lib "$name"); then
            echo "$name from $d"
            figure "lib_${name%%.so*}" "$(json_str "$d")"
            case ":$libs:" in *":$d:"*) ;; *) libs="$libs:$d" ;; esac
        else
            missing="$missing $name"
        fi
    done
    # cuDNN's directory differs from cuBLASLt's in PyTorch's wheels (nvidia/cudnn/lib beside
    # nvidia/cu13/lib) and is in no linker cache there: without it here, every attention would
    # run the flash kernel.
    CUDNN_FOUND=false
    for name in $ATTENTION_LIBS; do
        if d=$(find_machine_lib "$name"); then
            echo "$name from $d"
            figure "lib_${name%%.so*}" "$(json_str "$d")"
            case ":$libs:" in *":$d:"*) ;; *) libs="$libs:$d" ;; esac
            [ "$name" = libcudnn.so.9 ] && CUDNN_FOUND=true
        else
            case $name in
            libcudnn*) echo "$name: not on this machine: every attention runs the flash kernel" ;;
            *) echo "$name: not on this machine: cuDNN's runtime-compiled engines cannot load" ;;
            esac
            figure "lib_${name%%.so*}" null
        fi
    done
    figure cudnn_found "$CUDNN_FOUND"
    LIBPATH="$dir/lib$libs"
    mkdir -p "$dir/wrap"
    for p in "${PROGS[@]}"; do
        printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
            "$LIBPATH" "$dir/bin/$p" >"$dir/wrap/$p"
        chmod +x "$dir/wrap/$p"
    done
    BIN="$dir/wrap"
    echo "using the carried build ($CARRY/bundle.tar.xz) through $BIN"
    llmc_wrap "$dir"
    if [ -n "$missing" ]; then
        PHASE_WHY="not on this machine:$missing (the CUDA toolkit's or PyTorch's nvidia-* wheels)"
        SKIP_GPU=$PHASE_WHY
        return 1
    fi
    local unresolved
    # As the wrappers run them: the environment's LD_LIBRARY_PATH after the bundle's.
    unresolved=$(LD_LIBRARY_PATH="$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        ldd "${PROGS[@]/#/$dir/bin/}" \
        "$dir/lib/libztrain_cuda.so" 2>&1 \
        | awk '/not found/{print $1}' | sort -u | tr '\n' ' ')
    if [ -n "$unresolved" ]; then
        PHASE_WHY="libraries not found: $unresolved"
        SKIP_GPU=$PHASE_WHY
        return 1
    fi
}

# llm.c's wrapper, LLMC_BIN, when the bundle has it and the machine its libraries (cuDNN, NVRTC);
# otherwise LLMC_BIN stays empty and llmc_error says why (the benchmarks then run without it).
# LLMC_ARGS: the --llmc-bin arguments, the build without cuDNN after it where there is one.
LLMC_BIN=""
LLMC_ARGS=()
llmc_wrap() {
    local dir=$1 libs="$LIBPATH" name d missing=""
    if [ ! -x "$dir/bin/llmc_train_gpt2cu" ]; then
        figure llmc_error '"not in the bundle (prepared without LLMC_SRC)"'
        return 0
    fi
    figure llmc "$(json_str "$(cat "$dir/bin/LLMC" 2>/dev/null)")"
    for name in $LLMC_LIBS; do
        if d=$(find_machine_lib "$name"); then
            case ":$libs:" in *":$d:"*) ;; *) libs="$libs:$d" ;; esac
        elif grep -q "cudnn-frontend none" "$dir/bin/LLMC" 2>/dev/null; then
            : # built without cuDNN: needs neither
        else
            missing="$missing $name"
        fi
    done
    printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
        "$libs" "$dir/bin/llmc_train_gpt2cu" >"$dir/wrap/llmc_train_gpt2cu"
    chmod +x "$dir/wrap/llmc_train_gpt2cu"
    local unresolved
    unresolved=$(LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        ldd "$dir/bin/llmc_train_gpt2cu" 2>&1 \
        | awk '/not found/{print $1}' | sort -u | tr '\n' ' ')
    if [ -n "$missing$unresolved" ]; then
        figure llmc_error "$(json_str "llm.c's libraries not on this machine:$missing $unresolved")"
        return 0
    fi
    LLMC_BIN="$dir/wrap/llmc_train_gpt2cu"
    LLMC_ARGS=(--llmc-bin "$LLMC_BIN")
    if [ -x "$dir/bin/llmc_train_gpt2cu_nocudnn" ]; then
        sed "s|llmc_train_gpt2cu\"|llmc_train_gpt2cu_nocudnn\"|" "$dir/wrap/llmc_train_gpt2cu" \
            >"$dir/wrap/llmc_train_gpt2cu_nocudnn"
        chmod +x "$dir/wrap/llmc_train_gpt2cu_nocudnn"
        LLMC_ARGS+=(--llmc-bin "$dir/wrap/llmc_train_gpt2cu_nocudnn")
    fi
}

# Every op of the CUDA backend against the CPU backend on the same inputs, forward and backward,
# at fp32 and bf16 / fp16 (tests/unit/ops/harness.h's bounds). Each step gets what is left of the
# phase; one left too little is skipped, named in ops_skipped, its failures null.
phase_ops() {
    local limit=$1 t0=$SECONDS rc=0
    SKIPPED_STEPS=()
    # test_ops runs whatever test_cuda_host found: its ops against the CPU are the phase's point,
    # and a CUDA backend that cannot start fails them at once.
    bounded "$limit" "$LOGS/test_cuda_host.log" "$BIN/test_cuda_host" || rc=1
    bounded $((limit - (SECONDS - t0))) "$LOGS/test_ops.log" "$BIN/test_ops" || rc=$?
    figure ops_failures "$(failures "$LOGS/test_ops.log")"
    # Attention chooses cuDNN's fused attention for the 16-bit shapes it takes
    # (kernels/cuda/attention/attention.c): the run above checked those against the CPU. The family again
    # with ZTRAIN_ATTENTION=flash checks ztrain's flash kernel on the same cases, so both meet
    # the same reference on this GPU; the first "[ztrain] attention:" line says what ran.
    figure attention_choice \
        "$(json_str "$(grep -m1 '^\[ztrain\] attention:' "$LOGS/test_ops.log")")"
    bounded $((limit - (SECONDS - t0))) "$LOGS/test_ops_flash.log" \
        env ZTRAIN_ATTENTION=flash "$BIN/test_ops" --op attention || rc=1
    figure ops_flash_failures "$(failures "$LOGS/test_ops_flash.log")"
    # The linear layers' bias gradient comes from cuBLASLt's BGRADA / BGRADB epilogue where this
    # GPU's cuBLASLt has an algorithm for it, else from the row-tile sums (kernels/cuda/linear.cu;
    # the first "[ztrain] bias gradient:" line says which, and why). The linear families again
    # with ZTRAIN_CUDA_BIAS_GRAD=sums check the sums against the same reference on this GPU.
    figure bias_grad_choice \
        "$(json_str "$(grep -m1 '^\[ztrain\] bias gradient:' "$LOGS/test_ops.log")")"
    bounded $((limit - (SECONDS - t0))) "$LOGS/test_ops_bias_sums.log" \
        env ZTRAIN_CUDA_BIAS_GRAD=sums "$BIN/test_ops" --op linear --op linear_gelu \
        --op linear_twin || rc=1
    figure ops_bias_sums_failures "$(failures "$LOGS/test_ops_bias_sums.log")"
    figure ops_skipped "$(json_str "${SKIPPED_STEPS[*]:-}")"
    # test_ops writes its "backends:" line at once (line-buffered), so it is there unless the
    # CUDA backend was not among them.
    if ! grep -q 'backends: cpu cuda' "$LOGS/test_ops.log"; then
        [ -n "$PHASE_WHY" ] || PHASE_WHY="the CUDA backend did not run: $(grep -m1 -i 'cuda' \
            "$LOGS/test_ops.log")"
        [ "$rc" -ne 0 ] || rc=1
    fi
    if [ "$CUDNN_FOUND" != true ]; then
        local why="cuDNN's attention was not checked: libcudnn.so.9 is not on this machine, so \
test_ops ran the flash kernel in its place"
        figure ops_cudnn "$(json_str "$why")"
        [ -n "$PHASE_WHY" ] || PHASE_WHY=$why
        [ "$rc" -ne 0 ] || rc=1
    fi
    return "$rc"
}

# tests/gpu/train_check.py's checks; its FIGURE lines become figures of the JSON.
train_checks() {
    local limit=$1 checks=$2 prefix=$3
    local logf="$LOGS/train_$prefix.log" run_limit=$((limit > 10 ? limit - 5 : 5))
    [ "$run_limit" -le "$RUN_LIMIT" ] || run_limit=$RUN_LIMIT
    bounded "$limit" "$logf" python3 "$ROOT/tests/gpu/train_check.py" --bin "$BIN" \
        --dir "$SCRATCH/train-work" --checks "$checks" --timeout "$run_limit"
    local rc=$? name value
    while read -r _ name value; do figure "train_$name" "$value"; done \
        < <(grep '^FIGURE ' "$logf")
    figure "${prefix}_failures" "$(grep -c '^FAIL' "$logf")"
    rm -rf "$SCRATCH/train-work"
    return "$rc"
}
phase_curve() { train_checks "$1" gpt2,curve curve; }
phase_train() { train_checks "$1" llama,bf16,zero,memory,resume,nccl train; }

# GPT-2 124M on ztrain, llm.c (when carried) and PyTorch eager for about a minute: the first
# tokens/s and MFU figures, and the first ratios to llm.c and PyTorch on this GPU, in case the
# second command (the benchmark, with torch.compile) never gets its device time.
phase_throughput() {
    # Each run at most RUN_LIMIT seconds and half the phase: one that hangs leaves the next
    # (llm.c after ztrain) its time.
    local limit=$1 run_limit=$((limit > 30 ? (limit - 10) / 2 : 10))
    [ "$run_limit" -le "$RUN_LIMIT" ] || run_limit=$RUN_LIMIT
    bounded "$limit" "$LOGS/throughput.log" python3 "$ROOT/bench/bench_gpu.py" --ztrain-bin "$BIN" \
        --runs "ztrain${LLMC_BIN:+,llmc},torch_eager" "${LLMC_ARGS[@]}" \
        --models gpt2 --steps 20 --warmup 3 --micro-batch 8 \
        --timeout "$run_limit" --out "$LOGS/throughput.json"
    local rc=$?
    [ -s "$LOGS/throughput.json" ] && figure throughput "$(cat "$LOGS/throughput.json")"
    return "$rc"
}

# GPT-2 124M at B=16, T=1024 (the performance model's shape) for a few steps with `--profile`:
# every op's measured time, saved as profile-gpt2.json, and perf_model.md, the performance
# model's tables with it in the measured column (copy the profile into bench/gpu/ for
# bench/README.md's, docs/profiling.md).
phase_profile() {
    local limit=$1
    bounded "$limit" "$LOGS/profile.log" python3 "$ROOT/bench/bench_gpu.py" --ztrain-bin "$BIN" \
        --runs ztrain --models gpt2 --steps 4 --warmup 2 --micro-batch 16 --exact-batch \
        --profile "$OUT/profile-gpt2.json" --timeout $((limit > 20 ? limit - 10 : 10)) \
        --out "$LOGS/profile-run.json"
    local rc=$?
    if [ -s "$OUT/profile-gpt2.json" ]; then
        figure profile "$(cat "$OUT/profile-gpt2.json")"
        # The performance model's tables with this run's measured column beside the prediction.
        python3 "$ROOT/bench/perf_model.py" --gpu-dir "$OUT" >"$OUT/perf_model.md" \
            && grep -A20 '^| op |' "$OUT/perf_model.md" | head -18
    fi
    return "$rc"
}

phase_ops_perf() {
    bounded "$1" "$LOGS/test_ops_perf.log" "$BIN/test_ops" --perf
}

# The benchmark: ztrain against PyTorch eager and torch.compile (and llm.c, when carried) on GPT-2
# 124M, and the 1.1B Llama with and without offload. bench_gpu.py rewrites its JSON after each
# run, so a phase cut short keeps the runs before.
phase_bench() {
    local limit=$1
    bounded "$limit" "$LOGS/bench_gpu.log" python3 "$ROOT/bench/bench_gpu.py" --ztrain-bin "$BIN" \
        --runs "ztrain,torch_eager,torch_compile${LLMC_BIN:+,llmc}" "${LLMC_ARGS[@]}" \
        --steps 20 --warmup 5 --micro-batch 16 --timeout 180 --out "$LOGS/bench_gpu.json"
    local rc=$?
    [ -s "$LOGS/bench_gpu.json" ] && figure bench "$(cat "$LOGS/bench_gpu.json")"
    return "$rc"
}

# The run's verdict as its last lines, which the device tool returns (output_tail) even when
# OUTDIR does not come back: each phase's result, the checks' figures and the throughput.
summary() {
    log "summary (all of it in $OUT/gpu-check.json)"
    python3 - "$OUT/gpu-check.json" <<'EOF' 2>&1 \
        || grep -v '^  "\(throughput\|bench\|profile\)"' "$OUT/gpu-check.json"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r.get('device')}, driver {r.get('driver')}, bundle {r.get('bundle_commit')}")
for p in r.get("plan", "").split():
    ok = {True: "ok", False: "FAILED", None: "skipped"}[r.get(f"{p}_ok")]
    why = r.get(f"{p}_error", "")
    print(f"  {p:10s} {ok:7s} {r.get(f'{p}_seconds', '-')} s  {why[:300]}")
figs = {k: v for k, v in r.items() if k.startswith(("ops_", "train_", "attention", "bias_grad"))
        and not k.endswith(("_ok", "_seconds", "_error")) and not isinstance(v, dict)}
for k, v in figs.items():
    print(f"  {k}: {v}")
for part in ("throughput", "bench"):
    for family, runs in (r.get(part) or {}).items():
        if not isinstance(runs, dict) or "params" not in runs:
            continue
        for name, v in runs.items():
            if isinstance(v, dict):
                got = (f"{v['tokens_per_s']:,.0f} tokens/s, MFU {100 * (v.get('mfu') or 0):.1f}%,"
                       f" micro-batch {v.get('micro_batch')}" if v.get("tokens_per_s")
                       else f"failed: {str(v.get('error'))[:200]}")
                print(f"  {part} {family} {name}: {got}")
            elif name.startswith("ratio"):
                print(f"  {part} {family} {name}: {v:.3f}")
EOF
}

no_bundle() {
    echo "no bundle at $CARRY/bundle.tar.xz: run \`scripts/gpu-check.sh prepare\` on the \
development machine and bring build-gpu-carry/ (git-ignored: name it in the device tool's carry, \
or set ZT_GPU_CARRY); nothing is built here, which has no build dependencies"
}

# The run's plan from its options (--phases LIST, --budget SECONDS) and their defaults
# (ZT_GPU_PHASES, ZT_GPU_BUDGET): PLAN, the phases to run in PHASES' order with device and
# bundle always among them, and BUDGET. Any other argument is refused.
PLAN=()
BUDGET=$BUDGET_DEFAULT
read_plan() {
    local list=${ZT_GPU_PHASES:-$PLAN_DEFAULT} p name
    BUDGET=${ZT_GPU_BUDGET:-$BUDGET_DEFAULT}
    while [ $# -gt 0 ]; do
        case $1 in
        --phases) [ $# -ge 2 ] || die "--phases needs a list"; list=$2; shift 2 ;;
        --phases=*) list=${1#*=}; shift ;;
        --budget) [ $# -ge 2 ] || die "--budget needs seconds"; BUDGET=$2; shift 2 ;;
        --budget=*) BUDGET=${1#*=}; shift ;;
        *) die "unknown argument $1 (run OUTDIR [--phases LIST] [--budget SECONDS])" ;;
        esac
    done
    case $BUDGET in ''|*[!0-9]*) die "--budget $BUDGET: expected whole seconds" ;; esac
    [ "$list" = all ] && list=$(IFS=,; echo "${PHASES[*]}")
    for name in ${list//,/ }; do
        [ -n "${PHASE_LIMIT[$name]:-}" ] \
            || die "--phases: no phase $name (the phases: ${PHASES[*]}, or all)"
    done
    PLAN=()
    for p in "${PHASES[@]}"; do
        case ",device,bundle,$list," in *",$p,"*) PLAN+=("$p") ;; esac
    done
}

plan() {
    read_plan "$@"
    local p total=0
    printf '%-12s %s\n' phase "at most"
    for p in "${PLAN[@]}"; do
        printf '%-12s %d s\n' "$p" "${PHASE_LIMIT[$p]}"
        total=$((total + PHASE_LIMIT[$p]))
    done
    if [ "$total" -le "$BUDGET" ]; then
        echo "total        $total s, within the $BUDGET s budget"
    else
        echo "total        $total s: the $BUDGET s budget cuts the last phases short or skips them"
    fi
}

run() {
    OUT=${1:?usage: gpu-check.sh run OUTDIR [--phases LIST] [--budget SECONDS]}
    shift
    read_plan "$@"
    mkdir -p "$OUT" || die "cannot create $OUT"
    OUT=$(cd "$OUT" && pwd)
    exec > >(tee "$OUT/gpu-check.log") 2>&1
    local tee_pid=$!
    RUN_T0=$SECONDS
    log "gpu-check $(date -u +%FT%TZ) in $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
    log "phases: ${PLAN[*]}, within $BUDGET s"
    figure commit "$(json_str "$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)")"
    figure plan "$(json_str "${PLAN[*]}")"
    figure budget_seconds "$BUDGET"
    SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/ztrain-gpu-run.XXXXXX") || die "no temporary directory"
    LOGS="$SCRATCH/logs"
    mkdir -p "$LOGS" || die "cannot create $LOGS"
    # A cut run (the lease ends, a timeout kills the script) still leaves its JSON and its logs;
    # every run leaves no unpacked bundle (107 MB) and no scratch behind.
    trap 'INTERRUPTED=1; stop_step; figure interrupted true; write_json; pack_logs; exit 3' \
        INT TERM
    # The log's tee is waited for, or the run's last lines could land after the device tool has
    # taken OUTDIR; not when stopped in a phase, whose redirection keeps a copy of the log's pipe
    # open until the script exits (tee then ends at once).
    trap 'rm -rf ${BUNDLE_DIR:+"$BUNDLE_DIR"} "$SCRATCH"; close_phase_fd; exec >&- 2>&-
          [ -n "$INTERRUPTED" ] || wait '"$tee_pid" EXIT
    write_json
    if [ ! -f "$CARRY/bundle.tar.xz" ]; then
        figure bundle_ok false
        figure bundle_error "$(json_str "phase bundle: $(no_bundle)")"
        figure failed_phases '"bundle"'
        write_json
        echo "gpu-check: $(no_bundle)"
        exit 2
    fi
    # The CUDA release the bundle was built with, which sets the driver it needs.
    BUNDLE_CUDA=$(tar -xJOf "$CARRY/bundle.tar.xz" bin/CUDA_VERSION 2>/dev/null)
    local p
    for p in "${PLAN[@]}"; do
        phase "$p" "${PHASE_LIMIT[$p]}" "phase_$p"
    done
    figure failed_phases "$(json_str "${FAILED[*]:-}")"
    write_json
    summary
    log "done in $((SECONDS - RUN_T0)) s: ${#FAILED[@]} phase(s) failed${FAILED[*]:+: ${FAILED[*]}}"
    [ ${#FAILED[@]} -eq 0 ]
}

unpack() {
    PHASE_WHY=""
    phase_bundle 60
    local rc=$?
    echo "BIN=$BIN"
    [ -n "$PHASE_WHY" ] && echo "gpu-check: $PHASE_WHY" >&2
    return "$rc"
}

usage="usage: gpu-check.sh prepare | pack [BUILD [DEST]] | unpack
       | run OUTDIR [--phases LIST] [--budget SECONDS] | plan [--phases LIST] [--budget SECONDS]"
case "${1:-}" in
prepare) prepare ;;
pack) shift; pack "$@" ;;
unpack) unpack ;;
run) shift; run "$@" ;;
plan) shift; plan "$@" ;;
*) echo "$usage" >&2; exit 2 ;;
esac
