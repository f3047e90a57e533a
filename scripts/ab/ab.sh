#!/usr/bin/env bash
# A/B of decode builds or switches by medians of `ds4 bench --repeat`, on the GPU machine,
# with the synthetic DeepSeek-V4-Flash q2 model. Single runs on a lease vary by a few
# percent (an occasional slow run, some leases noisy throughout); the median of a
# process's repeats, alternated between configurations in rounds, resolves ~0.3%
# (bench/RESULTS.md, twenty-fifth stop on).
#
#   CONFIGS="base base_ds4
#   new ds4
#   off ds4 DS4_SHARED_LATER=0" scripts/ab/ab.sh
#
# Each CONFIGS line: a label, a binary in $CARRY (gzipped binaries are unpacked once), then
# any VAR=value the run takes. ROUNDS (2), REP (repeats a run, 6), LAYERS (43), P (prompt
# and chunk, 2048), GEN (128). Each run's CSV and log go to $OUT; one line a run to
# $OUT/ab.txt and stdout.
set -u
CARRY=${CARRY:-device-carry}
OUT=${OUT:-/tmp/ds4-ab}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
while read -r _ bin _; do
    [ -n "${bin:-}" ] && [ -f "$CARRY/$bin.gz" ] && [ ! -x "$CARRY/$bin" ] && gunzip -c "$CARRY/$bin.gz" > "$CARRY/$bin" && chmod +x "$CARRY/$bin"
done <<< "${CONFIGS:?CONFIGS lines: label binary VAR=value ...}"
for i in $(seq 1 "${ROUNDS:-2}"); do
    while read -r label bin envs; do
        [ -z "$label" ] && continue
        env $envs timeout 400 "$CARRY/$bin" bench --backend cuda --synthetic ds4-flash --recipe q2 --layers "${LAYERS:-43}" \
            --prefill "${P:-2048}" --chunk "${P:-2048}" --gen "${GEN:-128}" --repeat "${REP:-6}" > "$OUT/csv_${label}_$i.txt" 2> "$OUT/err_${label}_$i.txt"
        echo "$label $i: $(grep -o 'decode steady median.*' "$OUT/err_${label}_$i.txt")" | tee -a "$OUT/ab.txt"
    done <<< "$CONFIGS"
done
