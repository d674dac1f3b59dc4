#!/usr/bin/env bash
# The demo, run the way users run jobs: start ztraind, submit the demo job (examples/demo/) through
# the gRPC CLI, watch it to the end and print a sample from its final checkpoint. From a terminal
# ztraind and its dashboard then stay up, at the address printed, until Ctrl-C; without one (CI,
# a pipe) the demo stops the daemon and ends by itself. It needs only the build (no Python, no
# curl): the job trains a small byte-level GPT-2 on ztrain's own C sources, nothing downloaded.
#   usage: scripts/demo.sh [BUILD_DIR]     (ZTRAIN_DEMO_KEEP=0|1 overrides the terminal check)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
work="$build/demo"
rm -rf "$work"
mkdir -p "$work/data"
cp "$root/examples/demo/job.json" "$root/examples/demo/ds_config.json" "$work/data/"
"$root/examples/demo/make-data.sh" "$work/data"

keep=${ZTRAIN_DEMO_KEEP:-}
if [ -z "$keep" ]; then
  if [ -t 0 ] && [ -t 1 ]; then keep=1; else keep=0; fi
fi

# Port 0: ztraind picks free ports on loopback and says which on its ready line, so a second
# demo or a running daemon does not collide.
"$build/ztraind" --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
  --state-dir "$work/state" --data-root "$work/data" --runs-root "$work/runs" \
  > "$work/ztraind.log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
ready=
for _ in $(seq 300); do
  ready=$(grep -m1 "ztraind: ready" "$work/ztraind.log" || true)
  [ -n "$ready" ] && break
  kill -0 $daemon 2>/dev/null || { cat "$work/ztraind.log"; exit 1; }
  sleep 0.1
done
[ -n "$ready" ] || { echo "demo: ztraind did not get ready in 30 s" >&2; cat "$work/ztraind.log"; exit 1; }
echo "$ready"
grpc=$(sed -n 's/.* grpc=\([^ ]*\).*/\1/p' <<<"$ready")
url=$(sed -n 's/.* http=\([^ ]*\).*/\1/p' <<<"$ready")/
export ZTRAIN_SERVER="$grpc"

id=$("$build/ztrain" submit "$work/data/job.json")
echo "demo: submitted $id; its dashboard: $url#/jobs/$id"
"$build/ztrain" watch "$id"
"$build/ztrain" status "$id"
echo
echo "demo: a sample from the trained model (prompt \"static int \"):"
echo "----------------------------------------------------------------"
"$build/ztrain" sample "$work/runs/ckpt" --prompt "static int " --tokens 300 --temperature 0.8 --top-k 40
echo "----------------------------------------------------------------"
echo "demo: ztraind's state in $work/state, run directory $work/runs/$id, checkpoints in $work/runs/ckpt"
echo "demo: the loss series:  curl '${url}api/v1/jobs/$id/metrics?keys=train/loss,eval/loss'"

if [ "$keep" = 1 ]; then
  echo
  echo "demo: ztraind and its dashboard stay up at $url  (Ctrl-C stops them)"
  trap 'echo; echo "demo: stopping ztraind"' INT
  wait $daemon || true
  trap - INT
fi
kill -TERM $daemon 2>/dev/null || true
wait $daemon 2>/dev/null || true
trap - EXIT
