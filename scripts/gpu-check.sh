#!/usr/bin/env bash
# GPU check of the data plane: blocks in GPU memory put to and got back from a pool node
# (soft-shm, soft-TCP) and the file tier through pinned staging, every byte verified,
# bandwidths beside the cudaMemcpy floors of the same run.
#
#   scripts/gpu-check.sh --build   on a development machine (cargo): builds the stripped
#                                  binary scripts/gpu-check.bin (gitignored, ≤ 64 MiB)
#   scripts/gpu-check.sh           on the GPU machine (no cargo needed): runs it
#
# The binary runs its own kvcm server in-process; the GPU machine needs only the NVIDIA
# driver (libcuda is loaded at run time). It prints each phase's duration and finishes in
# well under 5 minutes; exit status 0 only when every round trip verified.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=scripts/gpu-check.bin

if [ "${1:-}" = "--build" ]; then
    started=$SECONDS
    cargo build --release -p kvcm-client --features cuda --bin kvcm-gpu-check
    cp target/release/kvcm-gpu-check "$binary"
    strip "$binary"
    size=$(stat -c %s "$binary")
    echo "gpu-check: built $binary ($((size >> 20)) MiB) in $((SECONDS - started)) s"
    if [ "$size" -gt $((64 << 20)) ]; then
        echo "gpu-check: $binary is larger than 64 MiB" >&2
        exit 1
    fi
    exit 0
fi

if [ ! -x "$binary" ]; then
    echo "gpu-check: $binary is missing: run 'scripts/gpu-check.sh --build' where cargo is" >&2
    exit 2
fi
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi
started=$SECONDS
timeout 300 "$binary"
echo "gpu-check: passed in $((SECONDS - started)) s"
