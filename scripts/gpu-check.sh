#!/usr/bin/env bash
# One command on the GPU machine: every generated CUDA kernel against its f64 reference,
# the tiny golden models end to end on the CUDA backend (and against the CPU backend), a
# model too big for the device memory refused before its upload (cuda_memory),
# `ds4 gen`, and `ds4 bench --backend cuda` next to the CPU; a short table last.
#
# Built here, run there (the GPU machine has no Rust toolchain):
#   scripts/gpu-check.sh --prepare      # release build + test binaries + golden files,
#                                       # stripped into device-carry/ (git-ignored)
#   scripts/gpu-check.sh                # on the device, with device-carry/ carried along
# Logs go to $OUT (or /tmp/ds4-gpu-check).
#
# The full-size benchmark (DeepSeek-V4-Flash shapes) runs where the GPU has the memory
# for it (the q2 file is 80.76 GiB: an H200), or where FULL=1 asks for it:
#   - `ds4 bench --synthetic ds4-flash --recipe q2` (random weights made on the device);
#   - the peer's file: ../shared/tools/mksynth.py writes it on the device (sparse), and
#     `ds4 bench --model` loads it through the normal loader.
# ONLY=kbench runs only the quant kernel benchmark.
# FULL_PREFILL (default 2048), FULL_GEN (32), FULL_LAYERS (43), FULL_REPEAT (3: runs a
# load, `ds4 bench --repeat`, the median decode rate last), FULL_FILE=0 (skip the
# mksynth file), FULL_PACK=1 (also the packed weight placement) and ONLY=full (skip the
# kernel and tiny-model checks) tune it; DS4_PROFILE=1 profiles the synthetic run. The
# synthetic run is repeated with DS4_CUDA_GRAPHS=0 (decode launched one by one).
set -u

CARRY=${CARRY:-device-carry}
# The GPU test binaries built here and run there.
TESTS="cuda_kernels cuda_golden cuda_memory"

if [ "${1:-}" = "--prepare" ]; then
    set -e
    TGT=${CARGO_TARGET_DIR:-target}
    cargo build --release -p ds4
    cargo test --release --no-run -p ds4-tests $(printf -- '--test %s ' $TESTS)
    rm -rf "$CARRY" && mkdir -p "$CARRY/golden/models"
    cp "$TGT/release/ds4" "$CARRY/ds4"
    for t in $TESTS; do
        # The newest build of each test binary (deps/<name>-<hash>, executable).
        bin=$(ls -t "$TGT"/release/deps/$t-* | grep -v '\.d$' | head -1)
        cp "$bin" "$CARRY/$t"
    done
    for b in ds4 $TESTS; do
        strip "$CARRY/$b"
        # Compressed: a device call carries at most 64 MiB with the working tree.
        gzip -9 -f "$CARRY/$b"
    done
    GOLDEN=${GOLDEN:-../shared/golden}
    for m in tiny-f32 tiny-q2 tiny-q4; do
        mkdir -p "$CARRY/golden/models/$m"
        cp "$GOLDEN/models/$m/"{model.gguf,reference.json,reference.safetensors,reference_plain.safetensors} "$CARRY/golden/models/$m/"
    done
    # The full-size benchmark's file generator, its tokenizer and the `gguf` package it
    # imports (a wheel: the device has no network; numpy, pyyaml, tqdm are there).
    cp ../shared/tools/mksynth.py "$CARRY/"
    cp model/assets/tokenizer.gguf "$CARRY/"
    mkdir -p "$CARRY/whl"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform any -d "$CARRY/whl" gguf==0.19.0
    du -sh "$CARRY"
    exit 0
fi

OUT=${OUT:-/tmp/ds4-gpu-check}
mkdir -p "$OUT"
for b in ds4 $TESTS; do
    if [ -f "$CARRY/$b.gz" ]; then gunzip -c "$CARRY/$b.gz" > "$CARRY/$b" && chmod +x "$CARRY/$b"; fi
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DS4_GOLDEN_DIR=$PWD/$CARRY/golden
M=$CARRY/golden/models

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u +%Y-%m-%dT%H:%MZ; } > "$OUT/device.txt" 2>&1

# The full-size benchmark: see the header.
full_bench() {
    local mem_mib
    mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    if [ "${FULL:-auto}" = 0 ] || { [ "${FULL:-auto}" = auto ] && [ "${mem_mib:-0}" -lt 100000 ]; }; then
        echo "full-size bench: skipped (GPU memory ${mem_mib} MiB; FULL=1 forces it)"
        return 0
    fi
    local P=${FULL_PREFILL:-2048} G=${FULL_GEN:-32} L=${FULL_LAYERS:-43} R=${FULL_REPEAT:-3} rc=0
    echo "== ds4 bench --synthetic ds4-flash --recipe q2 --layers $L (prefill $P, gen $G)"
    DS4_PROFILE=${DS4_PROFILE:-0} timeout ${FULL_TIMEOUT:-400} "$CARRY/ds4" bench --backend cuda --synthetic ds4-flash --recipe q2 --layers $L \
        --prefill $P --chunk $P --gen $G --repeat $R || { echo "synthetic bench failed: exit $?"; rc=1; }
    # Decode launched one by one, for comparison with the CUDA graphs (the default).
    echo "== ds4 bench --synthetic ds4-flash --recipe q2 --layers $L, DS4_CUDA_GRAPHS=0 (prefill $P, gen $G)"
    DS4_CUDA_GRAPHS=0 DS4_PROFILE=0 timeout ${FULL_TIMEOUT:-400} "$CARRY/ds4" bench --backend cuda --synthetic ds4-flash --recipe q2 --layers $L \
        --prefill $P --chunk $P --gen $G || { echo "synthetic bench (no graphs) failed: exit $?"; rc=1; }
    if [ "${FULL_PACK:-0}" = 1 ]; then
        # The other weight placement: one packed allocation instead of one per tensor.
        echo "== ds4 bench --synthetic ds4-flash --recipe q2 --layers $L --pack-weights (prefill $P, gen $G)"
        DS4_PROFILE=0 timeout ${FULL_TIMEOUT:-400} "$CARRY/ds4" bench --backend cuda --synthetic ds4-flash --recipe q2 --layers $L \
            --pack-weights --prefill $P --chunk $P --gen $G || { echo "packed synthetic bench failed: exit $?"; rc=1; }
    fi
    if [ "${FULL_FILE:-1}" = 1 ]; then
        local F=${SYNTH:-/tmp/ds4-synth-q2.gguf} t0
        t0=$(date +%s)
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$CARRY"/whl/*.whl
        PYTHONPATH=/tmp/site python3 "$CARRY/mksynth.py" "$F" --tokenizer "$CARRY/tokenizer.gguf" --layers $L || rc=1
        echo "mksynth: $(( $(date +%s) - t0 )) s; on disk: $(du -h "$F" | cut -f1), apparent $(du -h --apparent-size "$F" | cut -f1)"
        echo "== ds4 bench --model mksynth q2 (prefill $P, gen $G)"
        DS4_PROFILE=0 timeout ${FULL_TIMEOUT:-400} "$CARRY/ds4" bench --backend cuda --model "$F" --prefill $P --chunk $P --gen $G --repeat $R || rc=1
        rm -f "$F"
    fi
    return $rc
}

# The quant kernels alone at DeepSeek-V4-Flash's shapes (GB/s, TFLOP/s).
kernel_bench() {
    "$CARRY/ds4" bench --matvec --backend cuda --prefill ${KBENCH_PREFILL:-2048} --passes ${KBENCH_PASSES:-5}
}

if [ "${ONLY:-}" = kbench ]; then
    kernel_bench 2>&1 | tee "$OUT/kbench.log"
    exit "${PIPESTATUS[0]}"
fi

if [ "${ONLY:-}" = full ]; then
    full_bench 2>&1 | tee "$OUT/full.log"
    exit "${PIPESTATUS[0]}"
fi

"$CARRY/cuda_kernels" --nocapture --test-threads=1 > "$OUT/kernels.log" 2>&1; rc_kernels=$?
"$CARRY/cuda_golden" --nocapture --test-threads=1 > "$OUT/golden.log" 2>&1; rc_golden=$?
"$CARRY/cuda_memory" --nocapture > "$OUT/memory.log" 2>&1; rc_memory=$?

# `ds4 serve --backend $1` on the embedded default: two identical chat requests at
# temperature 0 over HTTP (python3's urllib), the same text back.
serve_check() {
    local err="$OUT/serve-$1.err" addr="" pid
    "$CARRY/ds4" serve --backend "$1" --port 0 2> "$err" &
    pid=$!
    for _ in $(seq 300); do
        addr=$(grep -o "listening on http://[^ ]*" "$err" | head -1 | sed 's|listening on ||')
        [ -n "$addr" ] || ! kill -0 $pid 2>/dev/null && break
        sleep 1
    done
    if [ -z "$addr" ]; then echo "serve $1: did not start"; cat "$err"; kill $pid 2>/dev/null; return 1; fi
    python3 - "$addr" "$1" <<'PY'
import json, sys, urllib.request
url, backend = sys.argv[1] + "/v1/chat/completions", sys.argv[2]
body = json.dumps({"model": "ds4", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 12, "temperature": 0, "reasoning_effort": "none"}).encode()
texts = []
for _ in range(2):
    with urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"}), timeout=600) as r:
        texts.append(json.load(r)["choices"][0]["message"]["content"])
print(f"serve {backend}: {texts[0]!r}")
print("serve: same text" if texts[0] == texts[1] else "serve: DIFFERENT text")
PY
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    return 0
}

{
    echo "== ds4 gen --target cuda-sm90 (tiny-q4)"
    "$CARRY/ds4" gen --target cuda-sm90 --model "$M/tiny-q4/model.gguf" --out "$OUT/gen" && ls "$OUT/gen" | wc -l
    echo "== ds4 run --backend cuda vs cpu (tiny-f32, greedy ids)"
    g=$("$CARRY/ds4" run --backend cuda --model "$M/tiny-f32/model.gguf" --tokens 1,2,3,4,5 -n 12 --ids)
    c=$("$CARRY/ds4" run --backend cpu --model "$M/tiny-f32/model.gguf" --tokens 1,2,3,4,5 -n 12 --ids)
    echo "cuda: $g"; echo "cpu:  $c"
    [ "$g" = "$c" ] && echo "run: same ids" || echo "run: DIFFERENT ids"
    echo "== ds4 serve --backend cuda (embedded default, two requests at temperature 0)"
    serve_check cuda
} > "$OUT/cli.log" 2>&1; rc_cli=$?
grep -q "run: same ids" "$OUT/cli.log" && grep -q "serve: same text" "$OUT/cli.log" || rc_cli=1
cp "$OUT/gen/manifest.json" "$OUT/manifest.json" 2>/dev/null; rm -rf "$OUT/gen"

{
    for m in tiny-q4 tiny-f32; do
        for b in cuda cpu; do
            echo "== $m $b"
            "$CARRY/ds4" bench --backend $b --model "$M/$m/model.gguf" --prefill 16,128 --gen 32
        done
    done
} > "$OUT/bench.log" 2>&1; rc_bench=$?

kernel_bench > "$OUT/kbench.log" 2>&1; rc_kbench=$?
full_bench > "$OUT/full.log" 2>&1; rc_full=$?

status() { [ "$1" = 0 ] && echo ok || echo "FAIL($1)"; }
{
    echo
    echo "ds4 gpu-check on $(head -1 "$OUT/device.txt")"
    echo "-----------------------------------------------------------------"
    sed -n '/^kernel /,/^hadamard_fp4/p' "$OUT/kernels.log"
    grep -E "dequant_rows bit-exact|aligned matvec|attention_tiled" "$OUT/kernels.log"
    grep -oE "(cuda tiny|cpu vs cuda).*" "$OUT/golden.log"
    grep -E "^refused: " "$OUT/memory.log"
    grep -E "^== |^[0-9]+," "$OUT/bench.log"
    grep -E "^what,|,(matvec|matmul)_" "$OUT/kbench.log"
    grep -E "^== |^[0-9]+,|^ds4 bench: |^mksynth|skipped" "$OUT/full.log"
    echo "-----------------------------------------------------------------"
    printf "%-28s %s\n" "kernel parity (cuda_kernels)" "$(status $rc_kernels)" \
        "tiny models (cuda_golden)" "$(status $rc_golden)" \
        "device memory (cuda_memory)" "$(status $rc_memory)" \
        "cli gen/run/serve" "$(status $rc_cli)" \
        "bench" "$(status $rc_bench)" \
        "quant kernel bench" "$(status $rc_kbench)" \
        "full-size bench" "$(status $rc_full)"
} | tee "$OUT/summary.txt"
[ $rc_kernels = 0 ] && [ $rc_golden = 0 ] && [ $rc_memory = 0 ] && [ $rc_cli = 0 ] && [ $rc_bench = 0 ] && [ $rc_kbench = 0 ] && [ $rc_full = 0 ]
