"""One local SparkSession for all replay tests, with settings that start it fast (a small
shuffle, no UI, the quick JVM profile)."""

from __future__ import annotations

import pathlib
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="pip install -e '.[spark]' to run the replay tests")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java 17 or 21 on PATH")
    from replay import start_spark, stop_spark

    spark = start_spark("local[2]", app="rdvpump-tests", jvm="quick", shuffle_partitions=2,
                    warehouse=str(tmp_path_factory.mktemp("warehouse")),
                    write_archive=False)  # it lives as long as its worker: left to others
    yield spark
    stop_spark(spark, archive=False)
