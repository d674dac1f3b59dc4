#!/usr/bin/env bash
# The embedded default job: trains a small byte-level GPT-2 on ztrain's own C sources (no
# download), shows the loss falling, and prints a sample from the final checkpoint.
#   usage: scripts/demo.sh [BUILD_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
work="$build/demo"
rm -rf "$work"
mkdir -p "$work"
cp "$root/examples/demo/job.json" "$root/examples/demo/ds_config.json" "$work/"

# The corpus: every C source and header of the project, read as bytes; the last tenth is held out
# for evaluation.
find "$root/engine" "$root/kernels" "$root/service" -name '*.[ch]' | sort | xargs cat > "$work/corpus.txt"
size=$(stat -c %s "$work/corpus.txt")
head -c $((size * 9 / 10)) "$work/corpus.txt" > "$work/train.txt"
tail -c +$((size * 9 / 10 + 1)) "$work/corpus.txt" > "$work/val.txt"
echo "demo: corpus of $size bytes from ztrain's own sources"

"$build/ztrain" run "$work/job.json" --out "$work/run"
echo
echo "demo: a sample from the trained model (prompt \"static int \"):"
echo "----------------------------------------------------------------"
"$build/ztrain" sample "$work/ckpt" --prompt "static int " --tokens 300 --temperature 0.8 --top-k 40
echo "----------------------------------------------------------------"
echo "demo: metrics in $work/run/metrics.jsonl, checkpoints in $work/ckpt"
