#!/usr/bin/env bash
# Install d3ray into the current Python environment, from the lock (uv.lock, exported to requirements/).
#   ./setup.sh          the package and its runtime dependencies
#   ./setup.sh --dev    plus the test tools and the optional extras the tests use
# Every package comes at the version the lock holds, so an install is the same on every machine and
# no resolver runs: requirements/cpu.txt (cpu-dev.txt with --dev) where there is no GPU, with
# torch's CPU build installed first (torch==2.13.0+cpu from pip's configured indexes and wheel
# folders, else PyTorch's CPU index); requirements/gpu.txt (torch 2.13.0 with its CUDA libraries)
# where nvidia-smi answers. D3RAY_TORCH_INDEX (a wheel index URL) overrides where torch comes from;
# a torch you installed yourself is kept. uv installs when it is on the PATH or in this Python, or
# when `pip install uv` gets it; else pip installs the same pins (every one exact, so it never
# backtracks; without the hashes, which pip's hash mode cannot take with extras); D3RAY_INSTALLER=pip
# forces pip. PYTHON picks the interpreter (default python3).
# Bytecode is compiled at install (uv --compile-bytecode; pip does by default; d3ray itself after),
# so that no Ray worker compiles torch, transformers or d3ray again where PYTHONDONTWRITEBYTECODE is set.
# `d3ray doctor` then tells what this environment can run.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
dev=0
case "${1:-}" in
  --dev) dev=1 ;;
  "") ;;
  *) echo "usage: ./setup.sh [--dev]" >&2; exit 2 ;;
esac
log=$(mktemp -t d3ray-setup.XXXXXX.log)
fail() { echo "setup.sh: $1 (full log: $log)" >&2; exit 1; }
# run CMD...: quiet, its output to the log; on failure, the step named with the last error line
run() {
  local what=$1; shift
  if ! "$@" >>"$log" 2>&1; then
    local last
    last=$(grep -E -i "error|failed|could not|no solution|connect|timed out|unreachable" "$log" | tail -n 1 || true)
    fail "$what failed${last:+: ${last}}"
  fi
}

"$PYTHON" -c "import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)" 2>/dev/null \
  || { echo "setup.sh: d3ray needs Python >= 3.11; $PYTHON is $("$PYTHON" -V 2>&1). Set PYTHON=python3.11 (or newer)." >&2; exit 2; }
python_exe=$("$PYTHON" -c "import sys; print(sys.executable)")

# the installer: uv (PATH, or this Python's module, or pip-installed now), else pip on the same files
tool=uv
if [ "${D3RAY_INSTALLER:-}" = pip ]; then
  tool=pip; installer=("$PYTHON" -m pip install --quiet)
elif command -v uv >/dev/null 2>&1; then
  installer=(uv pip install --python "$python_exe" --quiet --compile-bytecode)
elif "$PYTHON" -m uv --version >/dev/null 2>&1 || "$PYTHON" -m pip install --quiet uv >>"$log" 2>&1; then
  installer=("$PYTHON" -m uv pip install --python "$python_exe" --quiet --compile-bytecode)
else
  echo "setup.sh: uv is not installable here; installing the same pins with pip"
  tool=pip; installer=("$PYTHON" -m pip install --quiet)
fi

start=$SECONDS
requirements=(-r requirements/cpu.txt)
[ "$dev" = 1 ] && requirements=(-r requirements/cpu-dev.txt)
if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
  # torch alone, without its dependencies: the lock pins them (sympy, networkx, ...), next step
  if [ -n "${D3RAY_TORCH_INDEX:-}" ]; then
    run "torch 2.13.0 from D3RAY_TORCH_INDEX=$D3RAY_TORCH_INDEX" \
      "$PYTHON" -m pip install --quiet --no-deps "torch==2.13.0" --index-url "$D3RAY_TORCH_INDEX"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    requirements=(-r requirements/gpu.txt)       # torch 2.13.0 and its CUDA libraries from the lock
    [ "$dev" = 1 ] && requirements+=(-r requirements/cpu-dev.txt)
  elif ! "$PYTHON" -m pip install --quiet --no-deps "torch==2.13.0+cpu" >>"$log" 2>&1; then
    echo "setup.sh: no GPU, and pip's indexes hold no torch 2.13.0 CPU build: trying PyTorch's CPU index"
    if ! "$PYTHON" -m pip install --quiet --no-deps --retries 1 --timeout 30 "torch==2.13.0" \
        --index-url https://download.pytorch.org/whl/cpu >>"$log" 2>&1; then
      echo "setup.sh: PyTorch's CPU index is out of reach: installing the lock's torch 2.13.0 (the CUDA build, several GB)"
      requirements+=(-r requirements/gpu.txt)
    fi
  fi
fi
label="${requirements[*]}"
if [ "$tool" = pip ]; then
  # pip's hash-checking mode refuses a pinned package that another one asks for with an extra
  # (typepy[datetime]); pip gets the same pins without their hashes, every one exact, so it never backtracks
  pinned=$(mktemp -t d3ray-pins.XXXXXX.txt)
  for ((i = 1; i < ${#requirements[@]}; i += 2)); do
    sed -e '/^[[:space:]]*--hash=/d' -e 's/[[:space:]]*\\$//' "${requirements[i]}" >>"$pinned"
  done
  requirements=(-r "$pinned")
fi
run "installing $label with $tool (check that the package registry is reachable)" \
  "${installer[@]}" "${requirements[@]}"
run "installing d3ray itself" "${installer[@]}" --no-deps -e .
# d3ray's own bytecode too (uv's --compile-bytecode and pip compile site-packages, not an editable
# source): every Ray worker imports d3ray, and where PYTHONDONTWRITEBYTECODE is set it would compile
# the package again in each process
run "compiling d3ray's bytecode" "$PYTHON" -m compileall -q d3ray
echo "setup.sh: installed from the lock ($label, with $tool) in $((SECONDS - start)) s"

# DeepSpeed JIT-builds its CPU shared-memory collective op on first use (~2 min on 2 cores, once per
# machine: torch's extension cache is kept across environments); build it now, so that the first
# training run does not stall on it.
if "$PYTHON" -c "import sys, torch; sys.exit(1 if torch.cuda.is_available() else 0)"; then
  DS_ACCELERATOR=cpu "$PYTHON" -c "from deepspeed.accelerator import get_accelerator as g; b = g().create_op_builder('ShareMemCommBuilder'); b and b.load(verbose=False)" >>"$log" 2>&1 \
    || echo "note: DeepSpeed's CPU shm op did not build; DeepSpeed falls back to plain gloo collectives"
fi
accelerator=$("$PYTHON" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')" 2>/dev/null || echo cpu)
DS_ACCELERATOR=${DS_ACCELERATOR:-$accelerator} "$PYTHON" -c "import d3ray, torch, ray, deepspeed; print(f'd3ray {d3ray.__version__} ready: torch {torch.__version__}, ray {ray.__version__}, deepspeed {deepspeed.__version__}')" \
  || fail "the environment is incomplete: d3ray, torch, ray or deepspeed does not import"
rm -f "$log"
