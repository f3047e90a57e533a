#!/usr/bin/env bash
# On the GPU machine: builds scripts/lab/experts_lab.cu with variants of the generated
# routed experts' kernels (from `ds4 gen` output in $GEN: matvec_digits_iq2_xxs_swiglu.cu
# and matvec_digits_q2_k.cu) and runs it.
#   VARIANTS_GU / VARIANTS_DN: lines "name sed-program" (split at the first space), each
#   applied to $GEN's gate-and-up / down kernel text.
set -eu
GEN=${GEN:-device-carry/lab}
W=$(mktemp -d)
GU=matvec_digits_iq2_xxs_swiglu
DN=matvec_digits_q2_k
cp "$GEN/$GU.cu" "$GEN/$DN.cu" "$W"/
: > "$W/variants.cu"
LIST_GU=""
LIST_DN=""
while IFS= read -r line; do
    [ -z "$line" ] && continue
    n="${line%% *}"
    { echo "namespace gu_$n {"; sed -e "s/$GU(/${GU}_$n(/" -e "${line#* }" "$W/$GU.cu"; echo "}"; } >> "$W/variants.cu"
    LIST_GU="$LIST_GU {\"gate+up $n\", gu_$n::${GU}_$n},"
done <<< "${VARIANTS_GU:-}"
while IFS= read -r line; do
    [ -z "$line" ] && continue
    n="${line%% *}"
    { echo "namespace dn_$n {"; sed -e "s/$DN(/${DN}_$n(/" -e "${line#* }" "$W/$DN.cu"; echo "}"; } >> "$W/variants.cu"
    LIST_DN="$LIST_DN {\"down $n\", dn_$n::${DN}_$n},"
done <<< "${VARIANTS_DN:-}"
echo "#define GATE_UP_VARIANTS gus.insert(gus.end(), {$LIST_GU});" >> "$W/variants.cu"
echo "#define DOWN_VARIANTS dns.insert(dns.end(), {$LIST_DN});" >> "$W/variants.cu"
nvcc -O3 -arch=sm_90 --fmad=false -Xptxas -v -DVARIANTS -I"$W" scripts/lab/experts_lab.cu -o "$W/lab" 2> "$W/ptxas.txt" || { cat "$W/ptxas.txt"; exit 1; }
grep -E "Compiling|registers|spill" "$W/ptxas.txt" | paste - - - | sed 's/ptxas info    ://g' | grep -E "matvec_digits" | cut -c1-200
"$W/lab"
