#!/usr/bin/env bash
# Install d3ray into the current Python environment.
#   ./setup.sh          the package and its runtime dependencies
#   ./setup.sh --dev    plus the test tools (pytest, hypothesis, ruff)
# torch is installed first, pinned to 2.13.0, when no torch is present: the project's own range
# (torch>=2.4) would otherwise pull a multi-GB CUDA build on a CPU-only box. Without a GPU (no
# nvidia-smi) the CPU build torch==2.13.0+cpu is installed: from pip's configured indexes and wheel
# folders where they hold it, else from PyTorch's CPU wheel index, else (that index out of reach: a
# box that sees PyPI only) PyPI's torch==2.13.0, as before. With a GPU, torch==2.13.0 from pip.
# D3RAY_TORCH_INDEX (a wheel index URL, passed to pip as --index-url) overrides all of this; or install
# torch yourself first.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"

if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
  if [ -n "${D3RAY_TORCH_INDEX:-}" ]; then
    "$PYTHON" -m pip install --quiet "torch==2.13.0" --index-url "$D3RAY_TORCH_INDEX"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet "torch==2.13.0"
  elif ! "$PYTHON" -m pip install --quiet "torch==2.13.0+cpu" 2>/dev/null; then
    echo "setup.sh: no GPU, and pip's indexes hold no torch 2.13.0 CPU build: trying PyTorch's CPU index"
    "$PYTHON" -m pip install --quiet --retries 1 --timeout 30 "torch==2.13.0" \
        --index-url https://download.pytorch.org/whl/cpu \
      || { echo "setup.sh: PyTorch's CPU index is out of reach: installing torch==2.13.0 from pip's index (CUDA build)"
           "$PYTHON" -m pip install --quiet "torch==2.13.0"; }
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
