#!/usr/bin/env bash
# Runs the suites that need real DeepSpeed or transformers 5 (`make test-deepspeed`), DS_JOBS at
# a time (default: the cores), each with its own OMP_NUM_THREADS, and prints each one's output
# whole, in the order below, once it has ended; the run fails if any suite failed.
#
#   tests/deepspeed/run.sh BUILD_DIR [SUITE...]     (default: every suite below)
#
# The suites are independent processes: each takes its own ports (tests/ports.py) and temporary
# directories. DeepSpeed compiles its CPU ops (cpu_adam, fused_adam, the shm communicator) into
# ~/.cache/torch_extensions the first time a suite needs one; a second suite that needs it
# meanwhile waits on that build's lock file.
set -uo pipefail
cd "$(dirname "$0")/../.."
build="$(cd "${1:?usage: tests/deepspeed/run.sh BUILD_DIR [SUITE...]}" && pwd)" || exit 2
shift

# Each suite and the OpenMP threads it runs with (the torch side's; "-" leaves it unset), longest
# first, so that the last to start are short.
SUITES=(test_ds_config_accept:2 test_deepspeed_sft:1 test_torchrun_cli:- test_hf5_configs:2
        test_ds_schedule_parity:1 test_ds_removed_keys:1 test_client_batch_rule:-
        test_ds_grad_accum:1 test_ds_null_parity:1 test_ds_batch_auto:1 test_ds_scaler_parity:1
        test_ds_effective_config:1 test_hf5_warmup:1 test_hf5_tokenizer_class:-)
declare -A THREADS
for entry in "${SUITES[@]}"; do
  THREADS[${entry%:*}]=${entry#*:}
done
suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=("${SUITES[@]%:*}")
for s in "${suites[@]}"; do
  if [ -z "${THREADS[$s]:-}" ]; then
    echo "deepspeed: no suite $s (one of: ${SUITES[*]%:*})" >&2
    exit 2
  fi
done
# The cores, counted before any OMP_NUM_THREADS is set (nproc obeys it).
jobs_max="${DS_JOBS:-$(nproc)}"
logs="$build/deepspeed"
mkdir -p "$logs"

run_one() {
  local s="$1" env=(ZTRAIN_BUILD="$build") start rc
  [ "${THREADS[$s]}" != - ] && env+=(OMP_NUM_THREADS="${THREADS[$s]}")
  start=$(date +%s)
  env "${env[@]}" /usr/bin/python3 "tests/deepspeed/$s.py" >"$logs/$s.log" 2>&1
  rc=$?
  echo "$rc $(( $(date +%s) - start ))" >"$logs/$s.status"
}

running=0
for s in "${suites[@]}"; do
  if [ "$running" -ge "$jobs_max" ]; then
    wait -n
    running=$((running - 1))
  fi
  rm -f "$logs/$s.status"
  run_one "$s" &
  running=$((running + 1))
done
wait

failed=()
for s in "${suites[@]}"; do
  read -r rc secs <"$logs/$s.status" 2>/dev/null || { rc=?; secs=?; }
  echo "=== tests/deepspeed/$s.py (exit $rc, $secs s)"
  cat "$logs/$s.log"
  [ "$rc" = 0 ] || failed+=("$s")
done
echo
if [ ${#failed[@]} -gt 0 ]; then
  echo "deepspeed: ${#failed[@]} of ${#suites[@]} suite(s) failed: ${failed[*]}" \
       "(logs in $logs/)" >&2
  exit 1
fi
echo "deepspeed: ${#suites[@]} suite(s) passed"
