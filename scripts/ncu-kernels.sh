#!/usr/bin/env bash
# On the GPU machine: Nsight Compute's view (occupancy, registers, throughput, stall
# reasons) of chosen quant kernels, each profiled once inside `ds4 bench --matvec`.
#   scripts/ncu-kernels.sh [kernel-name ...]     (default: the decode and prefill kernels
#                                                 that dominate the full-size model)
# Needs a runtime where ncu can read counters (Firecracker; see the device notes).
set -u
CARRY=${CARRY:-device-carry}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
. "$(dirname "$0")/lab/lab.sh"
NCU=$(ncu_bin)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
KERNELS=${*:-matvec_q8_0 matvec_iq2_xxs matmul_mma_q8_0 matmul_mma_iq2_xxs}
for k in $KERNELS; do
    echo "== $k"
    "$NCU" --clock-control none -k "regex:^$k\$" -c 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        "$CARRY/ds4" bench --matvec --backend cuda --prefill 2048 --passes 1 2>&1 |
        grep -E "Duration|Registers Per|Shared Memory Configuration Size|Static Shared|Achieved Occupancy|Theoretical Occupancy|Block Limit|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Stall|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Issue Slot|Executed Ipc|Grid Size|Block Size|Mem Busy|Max Bandwidth" | head -40
done
