"""amqlite on Apache Spark: the ``amqlite`` data source and the delivery audit.

::

    from amqlite.spark import register, session
    spark = session("local[*]")          # checks Java and the workers' Python first
    register(spark)
    df = spark.read.format("amqlite").option("servers", "127.0.0.1:5555") \\
        .option("queue", "events").load()

Needs the ``spark`` extra (``pip install 'amqlite[spark]'``) and a Java 17+ runtime.
Nothing here imports pyspark until it is called, so ``import amqlite`` works
without the extra. See ``docs/spark.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .bridge import SparkSourceError
from .environment import SparkEnvironmentError, check_environment, check_java, check_python_workers

__all__ = [
    "SparkEnvironmentError",
    "SparkSourceError",
    "check_environment",
    "check_java",
    "check_python_workers",
    "register",
    "session",
]


def _pyspark_missing() -> SparkEnvironmentError:
    return SparkEnvironmentError(
        "pyspark is not installed: install the spark extra, `pip install 'amqlite[spark]'`"
    )


def register(spark: Any) -> None:
    """Make ``format("amqlite")`` available on the SparkSession ``spark``.

    The Python data source is registered as ``amqlite_python``; when the session's
    JVM has the JVM reader (:func:`session` put its jar on ``spark.jars``), that
    one answers ``format("amqlite")`` and hands it what it does not do itself,
    else the Python source is registered as ``amqlite`` too."""
    try:
        from .source import AmqliteDataSource, AmqlitePythonDataSource
    except ImportError as exc:
        if exc.name and exc.name.split(".")[0] in ("pyspark", "pyarrow", "pandas", "py4j"):
            raise _pyspark_missing() from exc
        raise
    from .jar import loaded

    spark.dataSource.register(AmqlitePythonDataSource)
    if not loaded(spark):
        spark.dataSource.register(AmqliteDataSource)


def session(
    master: str = "local[*]",
    app_name: str = "amqlite",
    config: dict[str, str] | None = None,
    log_file: str | Path | None = None,
    jvm_reader: bool = True,
) -> Any:
    """A SparkSession with the environment checked, the workers on this interpreter
    and the ``amqlite`` source registered.

    With ``log_file``, when this call starts the JVM, nothing of Spark's reaches the
    console: the JVM's stdout and stderr and Spark's log (WARN and above) are
    appended to that file (see ``jvm_log``).

    With ``jvm_reader`` (the default) the JVM reader's jar (:mod:`.jar`, built on
    first use) goes on ``spark.jars``, so batch reads of ``format("amqlite")`` run
    in the JVM; without it, or without a JDK, everything goes through the Python
    data source."""
    python = check_environment()
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise _pyspark_missing() from exc
    from .jvm_log import java_options, jvm_started, output_to

    log_path = None if log_file is None or jvm_started() else Path(log_file)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        "spark.pyspark.python": python,
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.enabled": "false",
        **(config or {}),
    }
    if jvm_reader:
        from .jar import jar_path

        jar = jar_path()
        if jar is not None:
            jars = settings.get("spark.jars", "")
            settings["spark.jars"] = f"{jars},{jar}" if jars else str(jar)
    if log_path is not None:
        key = "spark.driver.extraJavaOptions"
        settings[key] = java_options(log_path, settings.get(key, ""))
    for key, value in settings.items():
        builder = builder.config(key, value)
    if log_path is None:
        spark = builder.getOrCreate()
    else:
        with output_to(log_path):
            spark = builder.getOrCreate()
    register(spark)
    return spark
