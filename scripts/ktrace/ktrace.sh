#!/usr/bin/env bash
# Every kernel's start and end on the GPU, CUDA-graph nodes included, for any command:
#   scripts/ktrace/ktrace.sh TRACE.txt -- device-carry/ds4 bench --backend cuda ...
#   python3 scripts/ktrace/summary.py TRACE.txt
# The GPU machine has CUPTI but no Nsight Systems; Nsight Compute times kernels one at a
# time with the graphs off, so it cannot show how a decode step's kernels overlap and
# wait inside a graph. ktrace.cpp is a CUDA injection library (CUDA_INJECTION64_PATH)
# that records CUPTI's kernel activity and writes "start end stream name" lines (ns) at
# exit. Built here on first use with g++ against the toolkit's CUPTI (no nvcc needed).
# Tracing costs time on the host: a traced decode is slower than an untraced one (the
# host records graph chunks late, gaps appear between them), so read kernel durations
# and the order inside a chunk, not the step rate.
set -eu
OUTF=$1; shift
[ "${1:-}" = "--" ] && shift
DIR=$(cd "$(dirname "$0")" && pwd)
LIB=${KTRACE_LIB:-/tmp/libktrace.so}
C=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$LIB" ]; then
    INC=$(dirname "$(find "$C"/ -name cupti_activity.h | head -1)")
    # The newest kernel, copy and fill record layouts the headers define.
    newest() { grep -ho "CUpti_Activity$1[0-9]*\b" "$INC"/cupti_activity*.h | sort -V | tail -1; }
    LIBDIR=$(dirname "$(find "$C"/ -name 'libcupti.so' | head -1)")
    g++ -O2 -shared -fPIC -DKREC="$(newest Kernel)" -DMREC="$(newest Memcpy)" -DSREC="$(newest Memset)" -I"$INC" -I"$C/include" "$DIR/ktrace.cpp" -L"$LIBDIR" -lcupti -Wl,-rpath,"$LIBDIR" -o "$LIB"
fi
KTRACE_OUT=$OUTF CUDA_INJECTION64_PATH=$LIB "$@"
