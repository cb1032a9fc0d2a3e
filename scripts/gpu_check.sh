#!/usr/bin/env bash
# Every CUDA path of amago_app against its CPU/float32 result, then the speed of the reference and long-context
# workloads (beside the original AMAGO when given), in one JSON file; under 8 minutes on one H100/H200-class GPU.
# Without a GPU: a dry check (configs compose, models build, bench scripts parse), one line, exit 0.
# docs/guide-gpu.md says what it measures and how to read the file; the logic is scripts/gpu_check.py.
#   bash scripts/gpu_check.sh                               # -> ./gpu_check.json
#   bash scripts/gpu_check.sh --out h100.json --original ../amago --original-python ../amago/.venv/bin/python
#   bash scripts/gpu_check.sh --help
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$HERE/../.venv/bin/python" ]; then PY="$HERE/../.venv/bin/python"; else PY="python3"; fi
fi
exec "$PY" "$HERE/gpu_check.py" "$@"
