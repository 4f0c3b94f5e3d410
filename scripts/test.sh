#!/usr/bin/env bash
# Command two: set up (if needed) and run every test (layer contracts, lint, then pytest).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
echo "== import-linter (layering, DESIGN §2)"
.venv/bin/lint-imports
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check --quiet . || { echo "ruff format would change the files above"; exit 1; }
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
export QT_QPA_PLATFORM=offscreen MUJOCO_GL=egl PYOPENGL_PLATFORM=egl
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
