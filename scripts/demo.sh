#!/usr/bin/env bash
# The embedded default job, run the way users run jobs: start ztraind, submit the job through
# the gRPC CLI, watch it to the end, show where its HTTP API and dashboard were, stop the daemon.
# The job trains a small byte-level GPT-2 on ztrain's own C sources (no download) and the demo
# prints a sample from its final checkpoint.
#   usage: scripts/demo.sh [BUILD_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
work="$build/demo"
rm -rf "$work"
mkdir -p "$work/data"
cp "$root/examples/demo/job.json" "$root/examples/demo/ds_config.json" "$work/data/"

# The corpus: every C source and header of the project, read as bytes; the last tenth is held out
# for evaluation.
find "$root/engine" "$root/kernels" "$root/service" -name '*.[ch]' | sort | xargs cat > "$work/corpus.txt"
size=$(stat -c %s "$work/corpus.txt")
head -c $((size * 9 / 10)) "$work/corpus.txt" > "$work/data/train.txt"
tail -c +$((size * 9 / 10 + 1)) "$work/corpus.txt" > "$work/data/val.txt"
echo "demo: corpus of $size bytes from ztrain's own sources"

# Free ports on loopback for this run, so a second demo or a running daemon does not collide.
ports=$(/usr/bin/python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')
read -r grpc_port http_port <<<"$ports"
"$build/ztraind" --grpc-addr "127.0.0.1:$grpc_port" --http-addr "127.0.0.1:$http_port" \
  --state-dir "$work/state" --data-root "$work/data" --runs-root "$work/runs" \
  > "$work/ztraind.log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  grep -q "ztraind: ready" "$work/ztraind.log" && break
  kill -0 $daemon 2>/dev/null || { cat "$work/ztraind.log"; exit 1; }
  sleep 0.1
done
grep "ztraind: ready" "$work/ztraind.log"
export ZTRAIN_SERVER="127.0.0.1:$grpc_port"

id=$("$build/ztrain" submit "$work/data/job.json")
echo "demo: submitted $id; dashboard and API at http://127.0.0.1:$http_port/ while it runs"
"$build/ztrain" watch "$id"
"$build/ztrain" status "$id"
echo "demo: metrics of the run:  curl 'http://127.0.0.1:$http_port/api/v1/jobs/$id/metrics?keys=train/loss,eval/loss'"
curl -s "http://127.0.0.1:$http_port/api/v1/jobs/$id/metrics?keys=train/loss&max_points=5" || true
echo

kill -TERM $daemon
wait $daemon || true
trap - EXIT
echo
echo "demo: a sample from the trained model (prompt \"static int \"):"
echo "----------------------------------------------------------------"
"$build/ztrain" sample "$work/runs/ckpt" --prompt "static int " --tokens 300 --temperature 0.8 --top-k 40
echo "----------------------------------------------------------------"
echo "demo: ztraind's state in $work/state, run directory $work/runs/$id, checkpoints in $work/runs/ckpt"
