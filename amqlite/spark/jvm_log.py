"""Keep Spark's JVM quiet on the console: when amqlite starts the JVM with a log
file, the JVM's own stdout and stderr (``WARNING: Using incubator modules``, the
launcher's lines, Python workers' stderr) and Spark's log4j output (the shipped
``log4j2.properties``: WARN and above) all go to that file instead.

The JVM inherits its stdout and stderr when PySpark spawns it, so this process's
file descriptors 1 and 2 point at the log file while the session starts, and are
put back right after; nothing else is printed in between.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")


def jvm_started() -> bool:
    """Whether this process already talks to a JVM (a session was started, or it
    runs under spark-submit): its output is then not ours to redirect."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return True
    try:
        from pyspark import SparkContext
    except ImportError:  # session() says what to install
        return False

    return SparkContext._active_spark_context is not None


def java_options(log_file: Path, existing: str = "") -> str:
    """``spark.driver.extraJavaOptions`` that point log4j at the shipped config and
    the config at ``log_file`` (after any options already set)."""
    ours = (
        f"-Dlog4j2.configurationFile={_quoted(LOG4J2_CONFIG)} "
        f"-Damqlite.spark.log={_quoted(log_file)}"
    )
    return f"{existing} {ours}".strip()


def _quoted(path: Path) -> str:
    text = str(path.resolve())
    return f'"{text}"' if any(c.isspace() for c in text) else text


@contextmanager
def output_to(log_file: Path) -> Iterator[None]:
    """File descriptors 1 and 2 write to ``log_file`` (appended) inside the block."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    log = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (log, *saved):
            os.close(fd)
