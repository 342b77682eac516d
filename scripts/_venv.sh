# Sourced by scripts/run and scripts/test: make ./.venv with amqlite and its dev
# extras installed, reinstalling only when pyproject.toml changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "amqlite needs Python >= 3.11 ($PY is $("$PY" --version 2>&1)); install it, e.g. 'sudo apt-get install python3.11 python3.11-venv'" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setting up $VENV ..." >&2
  "$PY" -m venv "$VENV" || { echo "could not create a venv: install python3-venv (e.g. 'sudo apt-get install python3-venv')" >&2; exit 1; }
fi
STAMP="$VENV/.amqlite-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
  echo "installing amqlite and its dependencies into $VENV ..." >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]" >&2
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
