#!/usr/bin/env bash
# On the GPU machine: builds scripts/lab/experts_lab.cu with variants of the generated
# routed experts' kernels (from `ds4 gen` output in $GEN: matvec_digits_iq2_xxs_swiglu.cu
# and matvec_digits_q2_k.cu) and runs it.
#   VARIANTS_GU / VARIANTS_DN: lines "name sed-program" (split at the first space), each
#   applied to $GEN's gate-and-up / down kernel text.
set -eu
GEN=${GEN:-device-carry/lab}
W=$(mktemp -d)
. "$(dirname "$0")/lab.sh"
GU=matvec_digits_iq2_xxs_swiglu
DN=matvec_digits_q2_k
cp "$GEN/$GU.cu" "$GEN/$DN.cu" "$W"/
: > "$W/variants.cu"
LIST_GU=$(lab_variants $GU gu_ "gate+up " "${VARIANTS_GU:-}")
LIST_DN=$(lab_variants $DN dn_ "down " "${VARIANTS_DN:-}")
echo "#define GATE_UP_VARIANTS gus.insert(gus.end(), {$LIST_GU});" >> "$W/variants.cu"
echo "#define DOWN_VARIANTS dns.insert(dns.end(), {$LIST_DN});" >> "$W/variants.cu"
lab_build scripts/lab/experts_lab.cu matvec_digits
"$W/lab"
# NCU=1: Nsight Compute's view of the generated gate-and-up and down launches.
if [ "${NCU:-0}" = 1 ]; then
    for k in $GU $DN; do lab_ncu "$k"; done
fi
