"""``register`` warns where Spark's Python workers would run an interpreter without the
client (issue 47 item 5: the quick start failed with "No module named 'aiokafka'")."""

from __future__ import annotations

import sys
from typing import Any

import pytest

pytestmark = pytest.mark.spark


def test_a_local_master_without_pyspark_python_is_warned_of(
    spark: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from client.spark import register

    caplog.set_level("WARNING", logger="client.spark")
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    register(spark)
    warned = [r.getMessage() for r in caplog.records if r.name == "client.spark"]
    assert len(warned) == 1 and f"PYSPARK_PYTHON={sys.executable}" in warned[0]

    caplog.clear()
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    register(spark)
    assert not [r for r in caplog.records if r.name == "client.spark"]
