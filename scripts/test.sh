#!/usr/bin/env bash
# The test command: install what is needed, lint, type-check (mypy: pyproject.toml's
# [tool.mypy], about 15 s of one core, run beside the tests), then both tiers of the
# suite on the CPU: tests/unit (fast: torch-free or one process) and tests/integration
# (gloo ranks, the end-to-end loop), in one pytest session of two test processes
# (pytest-xdist, a file's tests together, the longest files first: tests/conftest.py);
# the integration files marked `serial` (their waits or measurements need the machine
# to themselves) run afterwards, alone. Arguments go to every
# pytest run (e.g. -x, -k NAME).
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: scripts/test.sh [PYTEST-ARGS...]

Install what is needed (scripts/setup.sh), lint (ruff), type-check (mypy, beside the
tests), then run tests/unit and tests/integration on the CPU (two processes; the
`serial` files alone).
PYTEST-ARGS go to every pytest run, e.g. scripts/test.sh -x -k resume.
  -h, --help   this text (pytest's own: .venv/bin/python -m pytest --help)
USAGE
}
for arg in "$@"; do
  case "$arg" in -h|--help) usage; exit 0;; esac
done
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
# mypy (one core, single-threaded) runs beside the tests and is waited for after the
# parallel part: its status decides as before, its output is shown then
mypy_log=$(mktemp)
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"' EXIT
# byte-code of our own modules, read by every rank the tests start (0.4 s a process
# where PYTHONDONTWRITEBYTECODE keeps Python from writing it itself)
.venv/bin/python -m compileall -q -j 0 zoplan zoexec tests >/dev/null
# pytest's exit 5: the arguments selected no test in this part (e.g. -k NAME)
pytest_part() { .venv/bin/python -m pytest -q "$@" || { rc=$?; [ "$rc" -eq 5 ] || exit "$rc"; }; }
# one session for both tiers (the processes start once; the short unit files fill the
# gaps the long integration files leave at the end); files in tests/conftest.py's order
pytest_part -n 2 --dist loadfile --no-loadscope-reorder -m "not serial" \
  tests/integration tests/unit "$@"
mypy_rc=0
wait "$mypy_pid" || mypy_rc=$?
cat "$mypy_log"
[ "$mypy_rc" -eq 0 ] || exit "$mypy_rc"
pytest_part -m serial tests/integration "$@"
