# What the lab scripts share (sourced; $W is their work folder, holding the kernels' text).

# Kernel $1's variants from lines "name sed-program" ($4; split at the first space): for
# each, $W/$1.cu with the entry renamed $1_name and the program applied, in namespace
# $2name, appended to $W/variants.cu. Prints their entries for a C++ list:
# {"$3name", $2name::$1_name$5}.
lab_variants() {
    local kernel=$1 prefix=$2 label=$3 lines=$4 extra=${5:-} line n list=""
    while IFS= read -r line; do
        [ -z "$line" ] && continue
        n="${line%% *}"
        { echo "namespace $prefix$n {"; sed -e "s/$kernel(/${kernel}_$n(/" -e "${line#* }" "$W/$kernel.cu"; echo "}"; } >> "$W/variants.cu"
        list="$list {\"$label$n\", $prefix$n::${kernel}_$n$extra},"
    done <<< "$lines"
    printf '%s' "$list"
}

# Builds harness $1 into $W/lab with $W's variants (sm_90, as the runtime compiles:
# --fmad=false) and prints the registers and spills of the kernels matching $2.
lab_build() {
    nvcc -O3 -arch=sm_90 --fmad=false -Xptxas -v -DVARIANTS -I"$W" "$1" -o "$W/lab" 2> "$W/ptxas.txt" || { cat "$W/ptxas.txt"; exit 1; }
    grep -E "Compiling|registers|spill" "$W/ptxas.txt" | paste - - - | sed 's/ptxas info    ://g' | grep -E "${2:-.}" | cut -c1-200
}

# Nsight Compute on the GPU machine (none found: empty).
ncu_bin() {
    command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1
}

# Nsight Compute's view of the third launch of kernel $1 (named exactly) in $W/lab.
lab_ncu() {
    "$(ncu_bin)" --clock-control none -k "regex:^$1\$" -s 2 -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section InstructionStats "$W/lab" 2>&1 | grep -vE "^\s*$|----"
}
