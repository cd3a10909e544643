#!/usr/bin/env bash
# The GPU checks of issue 17 (docs/evidence/gpu.md): run from the repository root on a machine with an NVIDIA GPU.
#   scripts/gpu_check.sh cuda            nccl world size 1, placement, gloo on CUDA tensors, spans, NVML, no syncs
#   scripts/gpu_check.sh oom             a real CUDA out-of-memory: ctl set rolls back; the hpml-lab4-q1 profile
#   scripts/gpu_check.sh sharded         ddp/zero1/zero2/zero3/single switched in one job (nccl, world size 1):
#                                        one step and fingerprint per switch, memory by kind from the CUDA allocator
#   scripts/gpu_check.sh bench           plain torch vs --probes off vs all on VGG-11 and ResNet-18 (GPU): separate
#                                        runs, then interleaved in one process (benchmarks/step_overhead_ab.py)
#   scripts/gpu_check.sh suite [ARGS]    the test suite, tests/gpu (these checks as tests) included; tests/tui is
#                                        left out when textual is not installed
# Logs and recordings go to $OUT (default /tmp/ddptop-gpu). Wheels in .whl/ (see docs/evidence/gpu.md) are installed first.
set -u -o pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/ddptop-gpu}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the working tree's ddptop, no install
what="${1:-cuda}"
shift || true
case "$what" in
  cuda|oom|sharded)
    nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
    "$PY" scripts/gpu_check.py "$what" "$@" 2>&1 | tee "$OUT/$what.log" ;;
  bench)
    "$PY" scripts/gpu_check.py bench "$@" 2>&1 | tee "$OUT/bench.log"
    for model in vgg11 resnet18; do  # interleaved in one process on the GPU: plain, off, all; single and DDP
      "$PY" benchmarks/step_overhead_ab.py --device cuda --cases single,ddp --blocks 6 --block-steps 30 \
        --model "$model" 2>&1 | tee "$OUT/step_overhead_ab-cuda-$model.log"
    done ;;
  suite)
    skip=()
    "$PY" -c "import textual" 2>/dev/null || { echo "textual missing: tests/tui left out"; skip=(--ignore=tests/tui); }
    "$PY" -m pytest -q -x -p no:cacheprovider --durations=15 ${skip[@]+"${skip[@]}"} "$@" 2>&1 | tee "$OUT/suite.log" ;;
  *) echo "usage: scripts/gpu_check.sh cuda|oom|sharded|bench|suite [args]" >&2; exit 2 ;;
esac
