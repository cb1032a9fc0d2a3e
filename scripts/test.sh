#!/usr/bin/env bash
# Set up (scripts/setup.sh with the test extra) and run the test suite.
#   bash scripts/test.sh            # default suite (minutes on 2 CPUs)
#   bash scripts/test.sh --all      # also the slow learning tests
#   extra arguments go to pytest:  bash scripts/test.sh -k buffer -x
# Tests run in one process per core (pytest-xdist, `-n auto`); TEST_WORKERS=0 runs them in this one process, and an
# `-n N` given here wins.
set -euo pipefail
cd "$(dirname "$0")/.."
export EXTRAS="${EXTRAS:-test}"
bash scripts/setup.sh
VENV="${VENV:-.venv}"
MARK=(-m "not slow")
if [ "${1:-}" = "--all" ]; then
  MARK=()
  shift
fi
set +e
"$VENV/bin/python" -m pytest -n "${TEST_WORKERS:-auto}" "${MARK[@]}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
