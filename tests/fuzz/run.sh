#!/usr/bin/env bash
# Runs every libFuzzer target of a ZT_FUZZ build (`make test-fuzz`) for a bounded time over its
# committed corpus, and prints how long each ran, how many inputs it tried and how fast.
#
#   tests/fuzz/run.sh BUILD_DIR [TARGET...]      (default: every fuzz_* in BUILD_DIR)
#   FUZZ_SECONDS=N     seconds per target (default 60)
#   FUZZ_JOBS=N        targets run at once, one core each (default: the cores, nproc)
#   FUZZ_TIMEOUT=N     seconds one input may take (default 30)
#   FUZZ_TMPDIR=DIR    where the targets write their files (default /dev/shm, else $TMPDIR)
#
# The committed seeds (tests/fuzz/corpus/<target>/) are only read: what a run learns goes to
# BUILD_DIR/fuzz/corpus/<target>/, which the next run starts from too. An input that crashes a
# target, breaks one of its checks, leaks, or runs past FUZZ_TIMEOUT seconds fails the target
# and is kept as BUILD_DIR/fuzz/crashes/<target>/crash-<sha1> (or leak-, timeout-, oom-); replay
# it with BUILD_DIR/fuzz_<target> FILE, and once fixed, add it to the target's committed corpus
# so that the replay test (ctest -R fuzz/) keeps it fixed.
set -uo pipefail
cd "$(dirname "$0")/../.."
build="${1:?usage: tests/fuzz/run.sh BUILD_DIR [TARGET...]}"
shift
seconds="${FUZZ_SECONDS:-60}"
timeout_s="${FUZZ_TIMEOUT:-30}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for exe in "$build"/fuzz_*; do
    [ -x "$exe" ] && targets+=("${exe##*/fuzz_}")
  done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no fuzz_* programs in $build (configure it with -DZT_FUZZ=ON)" >&2
  exit 2
fi

# Undefined behaviour stops the run like a crash (the build also makes it fatal), with a stack.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}"
# The cores, counted before OMP_NUM_THREADS is set (nproc obeys it).
jobs_max="${FUZZ_JOBS:-$(nproc)}"
export OMP_NUM_THREADS=1
# The targets that read files write each input to one first: on a disk-backed /tmp that costs
# twenty times more than on tmpfs. They work in one directory for this run, removed at its end,
# so that a target stopped by a crash (which skips its own clean-up) leaves nothing behind.
base="${FUZZ_TMPDIR:-}"
if [ -z "$base" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
  base=/dev/shm
fi
TMPDIR="$(mktemp -d "${base:-${TMPDIR:-/tmp}}/ztrain-fuzz-run.XXXXXX")" || exit 2
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT

# One target: its libFuzzer run, then its summary line in $build/fuzz/<target>.summary (ending
# in FAILED when it found something). Targets run FUZZ_JOBS at a time, each on one core.
fuzz_one() {
  local t="$1"
  local exe="$build/fuzz_$t" seeds="tests/fuzz/corpus/$t" work="$build/fuzz/corpus/$t"
  local crashes="$build/fuzz/crashes/$t" log="$build/fuzz/$t.log"
  mkdir -p "$work" "$crashes"
  local args=(-max_total_time="$seconds" -timeout="$timeout_s" -rss_limit_mb=2048
              -max_len=65536 -print_final_stats=1 -close_fd_mask=3 -artifact_prefix="$crashes/")
  [ -f "tests/fuzz/$t.dict" ] && args+=(-dict="tests/fuzz/$t.dict")
  local start rc
  start=$(date +%s)
  "$exe" "${args[@]}" "$work" "$seeds" >"$log" 2>&1
  rc=$?
  local elapsed=$(( $(date +%s) - start ))
  local runs rate cov kept line
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  kept=$(find "$work" -type f | wc -l)
  line=$(printf '%-16s %5ss %10s runs %7s/s  cov %6s  corpus %5s' "$t" "$elapsed" "${runs:-?}" \
         "${rate:-?}" "${cov:-?}" "$kept")
  if [ $rc -ne 0 ] || [ -n "$(ls -A "$crashes")" ]; then
    line="$line  FAILED (rc $rc)"
  fi
  echo "$line" >"$build/fuzz/$t.summary"
}

mkdir -p "$build/fuzz"
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs_max" ]; then
    wait -n
    running=$((running - 1))
  fi
  echo "fuzz: $t for ${seconds} s (log: $build/fuzz/$t.log)"
  rm -f "$build/fuzz/$t.summary"
  fuzz_one "$t" &
  running=$((running + 1))
done
wait

failed=()
summary=()
for t in "${targets[@]}"; do
  line=$(cat "$build/fuzz/$t.summary" 2>/dev/null || echo "$t  FAILED (no summary)")
  summary+=("$line")
  if [[ "$line" == *FAILED* ]]; then
    failed+=("$t")
    echo "fuzz: $t FAILED; the end of $build/fuzz/$t.log:" >&2
    tail -n 40 "$build/fuzz/$t.log" >&2
    ls "$build/fuzz/crashes/$t" >&2
  fi
done

echo
echo "target            time        inputs run   exec/s   coverage    corpus"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}; inputs kept in $build/fuzz/crashes/" >&2
  exit 1
fi
echo "fuzz: no crashes in ${#targets[@]} target(s)"
