"""PySpark integration: the ``keyrange`` data source and the commit listener.

Needs the ``keyrange[spark]`` extra; ``import client`` never imports this package, so
workers without PySpark are unaffected.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

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
    "commit_positions",
    "enable_commits",
    "plan_batch_read",
    "register",
]


def register(spark: SparkSession) -> None:
    """Make ``format("keyrange")`` available in this session (driver side only)."""
    spark.dataSource.register(KeyrangeDataSource)


def enable_commits(
    spark: SparkSession, coordinator_url: str, token: str | None = None
) -> KeyrangeCommitter:
    """Report every finished micro-batch of ``keyrange`` streams to the coordinator."""
    committer = KeyrangeCommitter(coordinator_url, token)
    spark.streams.addListener(committer)
    return committer
