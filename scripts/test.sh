#!/usr/bin/env bash
# The test command: install what is needed, lint, type-check (mypy: pyproject.toml's
# [tool.mypy], about 10 s), then both tiers of the suite on the CPU:
# tests/unit (fast: torch-free or one process) and tests/integration (gloo ranks, the
# end-to-end loop). Two test processes at a time (pytest-xdist, a file's tests together);
# the integration files marked `serial` (they kill runs, sweep or count the shared-memory
# folder, or time waits) run afterwards, alone. Arguments go to every pytest run (e.g.
# -x, -k NAME).
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: scripts/test.sh [PYTEST-ARGS...]

Install what is needed (scripts/setup.sh), lint (ruff), type-check (mypy), then run
tests/unit and tests/integration on the CPU (two processes; the `serial` files alone).
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
.venv/bin/mypy
# byte-code of our own modules, read by every rank the tests start (0.4 s a process
# where PYTHONDONTWRITEBYTECODE keeps Python from writing it itself)
.venv/bin/python -m compileall -q -j 0 zoplan zoexec tests >/dev/null
# pytest's exit 5: the arguments selected no test in this part (e.g. -k NAME)
pytest_part() { .venv/bin/python -m pytest -q "$@" || { rc=$?; [ "$rc" -eq 5 ] || exit "$rc"; }; }
pytest_part -n 2 --dist loadfile tests/unit "$@"
pytest_part -n 2 --dist loadfile -m "not serial" tests/integration "$@"
pytest_part -m serial tests/integration "$@"
