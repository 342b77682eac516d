# Sourced by the scripts: make ./.venv with amqlite and the extras in
# AMQLITE_EXTRAS (default dev; scripts/test: dev,spark), reinstalling only when
# pyproject.toml changed. The spark extra (PySpark, for amqlite/spark and the tests
# marked `spark`) needs a Java 17+ runtime; AMQLITE_SKIP_SPARK=1 leaves it out and
# skips those tests. "bench" is not an extra of amqlite but the benchmark harness,
# its own distribution: benchmarks/ installed editable with its dependencies
# (pika, nats-py, matplotlib; scripts/bench asks for it). scripts/run (a broker)
# needs none of them.
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
# What to install: AMQLITE_EXTRAS, default "dev" (scripts/test asks for "dev,spark").
EXTRAS="${AMQLITE_EXTRAS:-dev}"
if [[ ",$EXTRAS," == *",spark,"* ]]; then
  if [ "${AMQLITE_SKIP_SPARK:-0}" = "1" ]; then
    EXTRAS="$(echo ",$EXTRAS," | sed 's/,spark,/,/; s/^,//; s/,$//')"
    echo "AMQLITE_SKIP_SPARK=1: not installing the spark extra; tests marked spark are skipped" >&2
  else
    java_says="$(java -version 2>&1 || true)"
    java_major=0
    if [[ "$java_says" =~ version\ \"1\.([0-9]+) ]] || [[ "$java_says" =~ version\ \"([0-9]+) ]]; then
      java_major="${BASH_REMATCH[1]}"
    fi
    if [ "$java_major" -lt 17 ]; then
      echo "the Spark data source and its tests need a Java 17+ runtime (found:" \
        "$([ "$java_major" = 0 ] && echo none || echo "Java $java_major"));" \
        "install one with 'sudo apt-get install -y openjdk-17-jdk-headless'" \
        "(or set AMQLITE_SKIP_SPARK=1 to skip the Spark tests)" >&2
      exit 1
    fi
    if ! command -v javac > /dev/null || ! command -v jar > /dev/null; then
      # Spark runs on a runtime alone, but the JVM reader and writer (the fast batch
      # path, amqlite/spark/jar.py) are compiled on first use and are tested here
      echo "the Spark JVM reader and its tests need a JDK (javac and jar; found" \
        "java only); install one with 'sudo apt-get install -y openjdk-17-jdk-headless'" \
        "(or set AMQLITE_SKIP_SPARK=1 to skip the Spark tests)" >&2
      exit 1
    fi
  fi
fi
# one stamp per extra: a venv set up by scripts/test serves scripts/run as it is
missing=""
for extra in ${EXTRAS//,/ }; do
  stamp="$VENV/.amqlite-installed-$extra"
  if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] ||
     { [ "$extra" = bench ] && [ "$ROOT/benchmarks/pyproject.toml" -nt "$stamp" ]; }; then
    missing="$missing $extra"
  fi
done
if [ -n "$missing" ]; then
  # amqlite's own extras, and the harness beside it in the same pip run (so that its
  # dependency on amqlite is this checkout, never a download)
  own="$(echo ",$EXTRAS," | sed 's/,bench,/,/; s/^,//; s/,$//')"
  targets=(-e "$ROOT${own:+[$own]}")
  what="amqlite${own:+[$own]}"
  if [ "$own" != "$EXTRAS" ]; then
    targets+=(-e "$ROOT/benchmarks")
    what="$what and the bench harness (benchmarks/)"
  fi
  echo "installing $what with their dependencies into $VENV ..." >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet "${targets[@]}" >&2
  for extra in ${EXTRAS//,/ }; do touch "$VENV/.amqlite-installed-$extra"; done
fi
export PATH="$VENV/bin:$PATH"
