#!/usr/bin/env bash
# Command one: set up (if needed) and open Twinbench on the demo project with the virtual lab.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
if [ -z "${DISPLAY:-}" ] && [ -z "${WAYLAND_DISPLAY:-}" ] && [ "${QT_QPA_PLATFORM:-}" != "offscreen" ]; then
  echo "Twinbench needs a display to open its window, and none is set (DISPLAY is empty)."
  echo "Run this on a desktop session, or use the command line: .venv/bin/python main.py --help"
  exit 1
fi
exec .venv/bin/python main.py demo "$@"
