"""PySpark integration: the ``keyrange`` data source, a drop-in for Spark's ``format("kafka")``
that reports what a job processed to the coordinator by itself (docs/spark.md).

Needs the ``keyrange[spark]`` extra; ``import client`` never imports this package, so
workers without PySpark are unaffected.
"""

from __future__ import annotations

import logging
import os
import sys

from pyspark.sql import SparkSession

from client.errors import KeyrangeClientError
from client.spark.commit import CommitFailed, KeyrangeCommitter, commit_positions
from client.spark.options import OptionError
from client.spark.source import SHORT_NAME, BatchRead, KeyrangeDataSource, plan_batch_read

__all__ = [
    "SHORT_NAME",
    "BatchRead",
    "CommitFailed",
    "KeyrangeCommitter",
    "KeyrangeDataSource",
    "OptionError",
    "SpeculationRefused",
    "commit_positions",
    "enable_commits",
    "plan_batch_read",
    "register",
]


logger = logging.getLogger(__name__)

SPECULATION = "spark.speculation"


class SpeculationRefused(KeyrangeClientError):
    """The session runs speculative copies of slow tasks, and the caller did not allow it."""


def register(spark: SparkSession, *, allow_speculation: bool = False) -> None:
    """Make ``format("keyrange")`` available in this session (driver side only).

    A session with ``spark.speculation`` on is refused unless ``allow_speculation``: a
    speculative copy reads its slice while the original still runs, so a key's records run
    user code in two tasks at once and every side effect is doubled (docs/spark.md, "Task
    retries and speculative execution"). Checked here because Spark fixes the setting when
    the session starts.
    """
    if str(spark.conf.get(SPECULATION, "false")).strip().lower() == "true":
        if not allow_speculation:
            raise SpeculationRefused(
                f"{SPECULATION} is on: a slow slice would be read and processed by two tasks "
                "at once. Turn it off, or call register(spark, allow_speculation=True) if "
                "what runs after the read is idempotent (docs/spark.md)"
            )
        logger.warning(
            "keyrange source registered with speculative execution on: slices may be "
            "processed twice at once",
            extra={"setting": SPECULATION},
        )
    _warn_of_python_workers(spark)
    spark.dataSource.register(KeyrangeDataSource)


def _warn_of_python_workers(spark: SparkSession) -> None:
    """On a local master Spark starts its Python workers with ``PYSPARK_PYTHON``, else
    ``python3`` from PATH: outside the environment that has aiokafka, every read fails in the
    workers with ``No module named 'aiokafka'``, far from the cause."""
    master = str(spark.conf.get("spark.master", "") or "")
    chosen = os.environ.get("PYSPARK_PYTHON") or spark.conf.get("spark.pyspark.python", None)
    if master.startswith("local") and not chosen:
        logger.warning(
            "Spark's Python workers will run `python3` from PATH, not this interpreter; set "
            f"PYSPARK_PYTHON={sys.executable} before the session starts (docs/spark.md)",
            extra={"master": master},
        )


def enable_commits(
    spark: SparkSession, coordinator_url: str, token: str | None = None
) -> KeyrangeCommitter:
    """Optional: the source reports its finished batches by itself. This listener adds the
    report of the last batch of a query stopped between triggers, and ``await_query``."""
    committer = KeyrangeCommitter(coordinator_url, token)
    spark.streams.addListener(committer)
    return committer
