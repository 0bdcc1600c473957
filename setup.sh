#!/usr/bin/env bash
# Install d3ray into the current Python environment.
#   ./setup.sh          the package and its runtime dependencies
#   ./setup.sh --dev    plus the test tools (pytest, hypothesis, ruff)
# torch is installed first, pinned to the 2.13.0 CPU build, when no torch is present: the
# project's own range (torch>=2.4) would otherwise pull a multi-GB CUDA build on a CPU-only box.
# On a machine whose pip does not serve that CPU build, set D3RAY_TORCH_INDEX to a PyTorch CPU
# wheel index URL (passed to pip as --index-url), or install torch yourself first.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"

if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
  if [ -n "${D3RAY_TORCH_INDEX:-}" ]; then
    "$PYTHON" -m pip install --quiet "torch==2.13.0" --index-url "$D3RAY_TORCH_INDEX"
  else
    "$PYTHON" -m pip install --quiet "torch==2.13.0"
  fi
fi
"$PYTHON" -m pip install --quiet -e ".${extras}"
# DeepSpeed JIT-builds its CPU shared-memory collective op on first use (~2 min on 2 cores);
# build it now, once, so that the first training run does not stall on it.
if "$PYTHON" -c "import sys, torch; sys.exit(1 if torch.cuda.is_available() else 0)"; then
  DS_ACCELERATOR=cpu "$PYTHON" -c "from deepspeed.accelerator import get_accelerator as g; b = g().create_op_builder('ShareMemCommBuilder'); b and b.load(verbose=False)" \
    || echo "note: DeepSpeed's CPU shm op did not build; DeepSpeed falls back to plain gloo collectives"
fi
"$PYTHON" -c "import d3ray, torch, ray, deepspeed; print(f'd3ray {d3ray.__version__} ready: torch {torch.__version__}, ray {ray.__version__}, deepspeed {deepspeed.__version__}')"
