"""The JVM reader's jar: ``amqlite/spark/jvm/*.java`` compiled against the Spark
jars pyspark ships, on first use, and cached by the hash of the sources and the
Spark version (``~/.cache/amqlite/spark-jvm/<hash>/amqlite-spark.jar``, or under
``$AMQLITE_CACHE``). :func:`amqlite.spark.session` puts it on ``spark.jars``.

Without ``javac`` and ``jar`` (a JRE only) there is no jar: one log line says so
and ``format("amqlite")`` is the Python data source for everything.

``python -m amqlite.spark.jar`` builds it and prints its path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("amqlite.spark")

SOURCES = Path(__file__).with_name("jvm")
PROVIDER = "amqlite.spark.AmqliteProvider"
JAR_NAME = "amqlite-spark.jar"


def _tool(name: str) -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / name).is_file():
        return str(Path(home) / "bin" / name)
    return shutil.which(name)


def _spark_jars() -> Path | None:
    try:
        import pyspark
    except ImportError:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    return jars if jars.is_dir() else None


def _digest(spark_jars: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(SOURCES.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(SOURCES)).encode() + b"\0" + path.read_bytes())
    h.update(b"\0".join(sorted(p.name.encode() for p in spark_jars.glob("spark-*.jar"))))
    return h.hexdigest()[:16]


def _cache_root() -> Path:
    root = os.environ.get("AMQLITE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "amqlite"


def jar_path() -> Path | None:
    """The reader's jar, built now if the cache has none; None (logged once) when
    it cannot be built here."""
    spark_jars = _spark_jars()
    javac, jar = _tool("javac"), _tool("jar")
    if spark_jars is None or javac is None or jar is None:
        missing = "pyspark's jars" if spark_jars is None else "javac and jar (a JDK)"
        log.warning(
            "amqlite: no %s here, so no JVM reader: format('amqlite') reads through the "
            "Python data source",
            missing,
        )
        return None
    target = _cache_root() / "spark-jvm" / _digest(spark_jars) / JAR_NAME
    if target.is_file():
        return target
    try:
        _build(javac, jar, spark_jars, target)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        log.warning(
            "amqlite: building the JVM reader failed, format('amqlite') reads through the "
            "Python data source: %s",
            str(detail).strip()[-2000:],
        )
        return None
    return target


def _build(javac: str, jar: str, spark_jars: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        sources = [str(p) for p in sorted(SOURCES.rglob("*.java"))]
        subprocess.run(
            [javac, "--release", "17", "-nowarn", "-d", str(classes),
             "-cp", str(spark_jars / "*"), *sources],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        shutil.copytree(SOURCES / "META-INF", classes / "META-INF")
        built = Path(tmp) / JAR_NAME
        subprocess.run(
            [jar, "cf", str(built), "-C", str(classes), "."],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        os.replace(built, target)  # atomic: a concurrent build just wins or loses


def loaded(spark: object) -> bool:
    """Whether the JVM of session ``spark`` has the reader (its jar was on
    ``spark.jars`` when the JVM started)."""
    try:
        jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
        loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        jvm.java.lang.Class.forName(PROVIDER, False, loader)
    except Exception:  # py4j's error for a missing class
        return False
    return True


if __name__ == "__main__":  # pragma: no cover - a command-line aid
    logging.basicConfig(level=logging.INFO)
    path = jar_path()
    print(path if path else "no jar (see the log line above)")
    sys.exit(0 if path else 1)
