"""The Spark example's session settings, without starting Spark."""

from __future__ import annotations

import pytest

from examples.spark_pipeline import parse_args, spark_settings


@pytest.fixture(autouse=True)
def _not_under_spark_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)


def test_a_local_run_binds_the_driver_to_loopback() -> None:
    for argv in ([], ["--master", "local[2]"]):
        settings = spark_settings(parse_args(argv))
        assert settings["spark.driver.bindAddress"] == "127.0.0.1"
        assert settings["spark.driver.host"] == "127.0.0.1"


def test_a_cluster_master_or_spark_submit_keeps_sparks_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert "spark.driver.bindAddress" not in spark_settings(
        parse_args(["--master", "spark://spark-master:7077"])
    )
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40000")
    assert "spark.driver.bindAddress" not in spark_settings(parse_args([]))


def test_a_driver_host_is_used_for_both_binding_and_advertising() -> None:
    settings = spark_settings(parse_args(["--master", "yarn", "--driver-host", "10.0.0.5"]))
    assert settings["spark.driver.bindAddress"] == settings["spark.driver.host"] == "10.0.0.5"
