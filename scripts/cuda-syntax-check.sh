#!/usr/bin/env bash
# Syntax- and type-checks every generated CUDA source with the host C++ compiler and a
# stub header (scripts/cuda_stub.h): catches most mistakes in generated or hand-lowered
# CUDA before a GPU run (inline PTX is not checked: g++ does not read asm strings).
#   [MODEL=m.gguf] scripts/cuda-syntax-check.sh [ds4 binary] [target]   (default: the embedded model)
set -u
BIN=${1:-target/release/ds4}
TARGET=${2:-cuda-sm90}
DIR=$(mktemp -d)
STUB=$(cd "$(dirname "$0")" && pwd)/cuda_stub.h
"$BIN" gen --target "$TARGET" ${MODEL:+--model "$MODEL"} --out "$DIR" >/dev/null 2>&1 || exit 1
fail=0
for f in "$DIR"/*.cu; do
    # Dynamic shared memory (`extern __shared__ T a[];`) as a sized static array for g++.
    sed -i 's/extern __shared__ \(.*\)\[\];/__shared__ \1[16];/' "$f"
    if ! g++ -std=c++17 -fsyntax-only -w -x c++ -include "$STUB" "$f" 2>"$DIR/err.txt"; then
        echo "== $(basename "$f")"; head -20 "$DIR/err.txt"; fail=1
    fi
done
n=$(ls "$DIR"/*.cu | wc -l)
rm -rf "$DIR"
[ $fail = 0 ] && echo "cuda syntax check: $n sources ok ($TARGET)"
exit $fail
