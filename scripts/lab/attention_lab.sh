#!/usr/bin/env bash
# On the GPU machine: builds scripts/lab/attention_lab.cu with variants of the generated
# attention (from `ds4 gen` output in $GEN) and runs it; NCU=1 adds Nsight Compute's view
# of the CSA-shaped launch.
set -eu
GEN=${GEN:-device-carry/lab}
W=$(mktemp -d)
. "$(dirname "$0")/lab.sh"
cp "$GEN"/attention_tiled.cu "$GEN"/attention_merge_rope.cu "$W"/
: > "$W/variants.cu"
# VARIANTS: lines "name sed-program" (split at the first space), each applied to $GEN's
# attention. E.g. the thirtieth stop's: fexp s/(float)exp((double)s - (double)m_new)/expf(s - m_new)/
LIST=$(lab_variants attention_tiled att_ "" "${VARIANTS:-}" ", attention_merge_rope")
# $NEW: other generations' attention and merge (folders, e.g. this tree's `ds4 gen`
# output, against $GEN's), each paired as it is and its merge after $GEN's attention.
i=0
for dir in ${NEW:-}; do
    i=$((i + 1))
    for f in attention_tiled attention_merge_rope; do
        { echo "namespace fresh$i {"; sed -e "s/$f(/${f}_new$i(/" "$dir/$f.cu"; echo "}"; } >> "$W/variants.cu"
    done
    LIST="$LIST {\"$(basename "$dir")\", fresh$i::attention_tiled_new$i, fresh$i::attention_merge_rope_new$i}, {\"old att, $(basename "$dir") merge\", attention_tiled, fresh$i::attention_merge_rope_new$i},"
done
echo "#define VARIANT_LIST ks.insert(ks.end(), {$LIST});" >> "$W/variants.cu"
lab_build scripts/lab/attention_lab.cu
"$W/lab"
if [ "${NCU:-0}" = 1 ]; then
    lab_ncu attention_tiled | tail -80
fi
