#!/usr/bin/env bash
# Set up Twinbench: system libraries (Debian/Ubuntu), a virtual environment at .venv, and the
# Python dependencies from pyproject.toml. Idempotent and quick when already set up.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Debian packages the libraries need (docs/TRAPS.md: GL/EGL, USB, Qt xcb plugin libraries, Xvfb for GUI tests).
APT_PKGS=(libusb-1.0-0 libgl1 libegl1 libegl-mesa0 libgl1-mesa-dri libglib2.0-0 libdbus-1-3
  libfontconfig1 libxkbcommon0 libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4 libxcb-image0
  libxcb-keysyms1 libxcb-randr0 libxcb-render-util0 libxcb-shape0 libxcb-xinerama0 libxcb-xkb1
  libx11-xcb1 xvfb xauth)

if command -v dpkg-query >/dev/null 2>&1; then
  missing=()
  for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = "0" ]; then
      echo "setup: installing system libraries: ${missing[*]}"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
      echo "setup: missing system libraries; run:"
      echo "  sudo apt-get install -y ${missing[*]}"
    fi
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.twinbench-deps
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing Python dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi
