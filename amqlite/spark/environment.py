"""Fast checks of what Spark needs before it starts a JVM: a Java 17+ runtime, and
Python workers that run this interpreter (with pyarrow and amqlite).

Without them Spark fails late and obscurely: no Java gives a gateway error, and a
worker interpreter without pyarrow (or without amqlite) fails a task only after a
long socket timeout. These checks take milliseconds and name the fix.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

JAVA_INSTALL = "apt-get install -y openjdk-17-jdk-headless"
MIN_JAVA = 17


class SparkEnvironmentError(RuntimeError):
    """Spark cannot run here; the message says what to install or set."""


def java_command() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.exists():
            return str(candidate)
    return shutil.which("java")


def java_version(java: str) -> int | None:
    """The major version ``java -version`` reports (8 for "1.8.0"), None if unknown."""
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    return major


def check_java() -> int:
    """Return the Java major version, or raise SparkEnvironmentError saying how to
    install a runtime."""
    java = java_command()
    if java is None:
        raise SparkEnvironmentError(
            f"Spark needs a Java {MIN_JAVA}+ runtime and none was found (no java on PATH, "
            f"JAVA_HOME unset): install one, e.g. `{JAVA_INSTALL}`"
        )
    version = java_version(java)
    if version is None or version < MIN_JAVA:
        seen = "an unknown version" if version is None else f"Java {version}"
        raise SparkEnvironmentError(
            f"Spark needs Java {MIN_JAVA}+, but {java} is {seen}: install a newer one, e.g. "
            f"`{JAVA_INSTALL}`, and put it first on PATH or set JAVA_HOME"
        )
    return version


def check_python_workers() -> str:
    """Make Spark's Python workers run this interpreter (``PYSPARK_PYTHON``, unless
    the user set it) and check that interpreter has pyarrow, pandas and amqlite.
    Returns the worker interpreter."""
    python = os.environ.get("PYSPARK_PYTHON") or sys.executable
    os.environ["PYSPARK_PYTHON"] = python
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    needed = ("pyarrow", "pandas", "amqlite")
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        missing = [m for m in needed if importlib.util.find_spec(m) is None]
    else:
        probe = (
            "import importlib.util as u, sys; "
            "print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))"
        )
        try:
            out = subprocess.run(
                [python, "-c", probe, *needed], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SparkEnvironmentError(
                f"Spark's Python workers would run PYSPARK_PYTHON={python}, which does not "
                f"start ({exc}): unset it to use {sys.executable}"
            ) from None
        missing = out.stdout.split()
    if missing:
        raise SparkEnvironmentError(
            f"Spark's Python workers run {python}, which lacks {', '.join(missing)}: "
            f"install the extra there (`{python} -m pip install 'amqlite[spark]'`) or point "
            f"PYSPARK_PYTHON at an interpreter that has it"
        )
    return python


def check_environment() -> str:
    """Both checks; returns the workers' interpreter."""
    check_java()
    return check_python_workers()
