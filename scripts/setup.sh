#!/usr/bin/env bash
# Create a virtual environment and install amago_app into it.
#   VENV=.venv (where)   EXTRAS=test (pip extras, comma-separated)   TORCH=torch==2.13.0 (torch requirement)
# torch is installed first and on its own: a bare `torch` requirement would pull a multi-GB CUDA build on
# machines where only the CPU wheel is wanted.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
EXTRAS="${EXTRAS:-}"
TORCH="${TORCH:-torch==2.13.0}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "$TORCH"
if [ -n "$EXTRAS" ]; then
  "$PY" -m pip install -q -e ".[$EXTRAS]"
else
  "$PY" -m pip install -q -e .
fi
echo "amago_app installed in $VENV ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"
