#!/usr/bin/env bash
# The prepared GPU run of issue #8: full-size correctness checks, then the calibration
# benchmark, on one GPU (written for an H200; any CUDA GPU works). At most ~8 minutes.
#
# Run from the repository root on the GPU machine:
#     bash gpu_validation/run_h200.sh            # extra arguments go to the bench, e.g. --quick
# Needs python with torch, triton, numpy and pyyaml (no simpy/pydantic: nothing here
# imports the simulator). Everything is written under $OUT (default ./gpu_out):
#     <gpu-slug>.yaml          the profile      -> copy to gpu_validation/profiles/
#     <gpu-slug>_raw.csv       every measurement -> copy to gpu_validation/profiles/
#     <gpu-slug>_summary.json  bandwidth share of HBM peak, paged/contiguous ratios, swap GB/s
#     bench.log, env.txt       console output and versions
set -u
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/kvsim-triton-cache}"  # not under $OUT

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory,pcie.link.gen.max,pcie.link.width.max \
        --format=csv 2>&1 || echo "nvidia-smi unavailable"
    python - <<'EOF'
import platform, sys
import numpy, torch, triton, yaml
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "triton", triton.__version__, "numpy", numpy.__version__, "pyyaml", yaml.__version__)
print("cuda available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# The bench keeps to a 360 s budget on its own; the timeout is the hard stop. SIGINT first,
# so a cut run still leaves its raw CSV (rewritten after every section).
timeout --signal=INT --kill-after=20 450 python -m kvsim.gpu_validation.bench --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}
echo "bench exit code: $rc (0 ok, 1 correctness failed, 2 no GPU, 124/130 timed out)" | tee -a "$OUT/bench.log"
ls -l "$OUT"
exit "$rc"
