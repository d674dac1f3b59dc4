#!/usr/bin/env bash
# The demo job's data: examples/demo/train.txt and val.txt beside job.json, made from ztrain's
# own C sources read as bytes (the job's model has a vocabulary of 256: one token per byte), the
# last tenth held out for evaluation. Nothing is downloaded.
#   usage: examples/demo/make-data.sh [OUT_DIR]   (default: this directory)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$here}"
mkdir -p "$out"
corpus="$(mktemp)"
trap 'rm -f "$corpus"' EXIT
find "$root/engine" "$root/kernels" "$root/service" -name '*.[ch]' | LC_ALL=C sort | xargs cat > "$corpus"
size=$(stat -c %s "$corpus")
if [ "$size" -lt 100000 ]; then
  echo "make-data.sh: only $size bytes of C sources under $root: run it from a ztrain checkout" >&2
  exit 1
fi
head -c $((size * 9 / 10)) "$corpus" > "$out/train.txt"
tail -c +$((size * 9 / 10 + 1)) "$corpus" > "$out/val.txt"
echo "make-data.sh: $out/train.txt and $out/val.txt from $size bytes of ztrain's C sources"
