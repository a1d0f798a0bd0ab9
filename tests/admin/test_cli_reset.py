"""``keyrange admin reset`` against a real coordinator and broker, in every mode: the plan is
shown and nothing changes unless ``--execute`` is given, and then the stored offsets are the
plan's. The rule each mode follows is tested in tests/core/test_reset_plan.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import pytest

from client.cli import main
from coordinator.kafka import ClusterMetadata
from tests.admin.conftest import FIRST_TIMESTAMP_MS, RECORDS, CliCluster
from tests.admin.test_cli import admin, rows_by, run_cli, tables

# Where each new group's offsets start: partition 0 at 25 with an IC range, partition 1 at 5.
STORED = {0: 25, 1: 5}


async def idle_group(cluster: CliCluster) -> str:
    group = cluster.group("cli-reset")
    await cluster.commit(group, 0, offset=STORED[0])
    await cluster.commit(group, 0, ranges=[[27, 29]])
    await cluster.commit(group, 1, offset=STORED[1])
    return group


def planned(printed: str) -> dict[int, int]:
    (plan,) = tables(printed)
    rows = rows_by(plan, "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET")
    assert {int(row["PARTITION"]): int(row["CURRENT-OFFSET"]) for row in rows} == STORED
    return {int(row["PARTITION"]): int(row["NEW-OFFSET"]) for row in rows}


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (["--to-earliest"], {0: 0, 1: 0}),
        (["--to-latest"], {0: RECORDS, 1: RECORDS}),
        (["--to-offset", "7"], {0: 7, 1: 7}),
        # Kafka keeps a shift within the log: 5 - 10 stops at the log start.
        (["--shift-by", "-10"], {0: 15, 1: 0}),
        (["--shift-by", "30"], {0: RECORDS, 1: 35}),
    ],
)
async def test_each_mode_plans_without_changing_and_applies_with_execute(
    cli_cluster: CliCluster,
    capsys: pytest.CaptureFixture[str],
    target: list[str],
    expected: dict[int, int],
) -> None:
    group = await idle_group(cli_cluster)
    reset = admin(cli_cluster, "reset", group, "--topic", cli_cluster.topic, *target)

    for dry_run in ([], ["--dry-run"]):
        assert await run_cli(*reset, *dry_run) == 0
        printed = capsys.readouterr()
        assert planned(printed.out) == expected
        assert "dry run, nothing changed: add --execute" in printed.err
        assert await cli_cluster.stable_offsets(group) == STORED

    assert await run_cli(*reset, "--execute") == 0
    printed = capsys.readouterr()
    assert planned(printed.out) == expected
    assert printed.err == ""
    assert await cli_cluster.stable_offsets(group) == expected


async def test_a_time_resets_to_the_first_record_at_or_after_it(
    cli_cluster: CliCluster, cluster_metadata: ClusterMetadata, capsys: pytest.CaptureFixture[str]
) -> None:
    twelfth = datetime.fromtimestamp((FIRST_TIMESTAMP_MS + 12_000) / 1000, UTC)
    partitions = [(cli_cluster.topic, 0), (cli_cluster.topic, 1)]
    answered = await cluster_metadata.offsets_for_time(partitions, FIRST_TIMESTAMP_MS + 12_000)
    group = await idle_group(cli_cluster)
    # The same instant in UTC and as local time without a zone, as Kafka's tool reads it.
    for written in (twelfth.isoformat(), twelfth.astimezone().replace(tzinfo=None).isoformat()):
        reset = admin(cli_cluster, "reset", group, "--topic", cli_cluster.topic)
        assert await run_cli(*reset, "--to-datetime", written) == 0
        assert planned(capsys.readouterr().out) == {p: answered[(t, p)] for t, p in partitions}
    if answered != {tp: 12 for tp in partitions}:
        pytest.skip(
            f"the broker answers ListOffsets by time with {answered}, not offset 12 (the "
            "embedded broker's is wrong); set KEYRANGE_TEST_KAFKA_BOOTSTRAP to a Kafka broker "
            "to check the exact offset"
        )
    assert await run_cli(*reset, "--to-datetime", twelfth.isoformat(), "--execute") == 0
    assert await cli_cluster.stable_offsets(group) == {0: 12, 1: 12}


async def test_named_partitions_only_and_without_a_target_only_ic_ranges_go(
    cli_cluster: CliCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    group = await idle_group(cli_cluster)
    reset = admin(cli_cluster, "reset", group, "--topic", cli_cluster.topic, "--execute")
    assert await run_cli(*reset, "--partitions", "1", "--to-offset", "3", "-o", "json") == 0
    reply = json.loads(capsys.readouterr().out)
    assert reply["dry_run"] is False
    assert [
        (p["partition"], p["previous_offset"], p["stable_offset"]) for p in reply["partitions"]
    ] == [(1, STORED[1], 3)]
    assert await cli_cluster.stable_offsets(group) == {0: STORED[0], 1: 3}

    assert await run_cli(*reset, "--partitions", "0") == 0
    capsys.readouterr()
    offsets = (await cli_cluster.api.get(f"/v1/admin/groups/{group}/offsets")).json()
    zero = offsets["partitions"][0]
    assert (zero["stable_offset"], zero["ranges"], zero["ic_offsets"]) == (STORED[0], [], 0)


async def test_a_reset_of_a_partition_never_committed_creates_it_only_on_execute(
    cli_cluster: CliCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    group = cli_cluster.group("cli-fresh")
    await cli_cluster.commit(group, 0, offset=4)
    reset = admin(cli_cluster, "reset", group, "--topic", cli_cluster.topic, "--partitions", "1")
    assert await run_cli(*reset, "--to-latest") == 0
    assert "CURRENT-OFFSET" in capsys.readouterr().out
    assert await cli_cluster.stable_offsets(group) == {0: 4}
    assert await run_cli(*reset, "--to-latest", "--execute") == 0
    assert await cli_cluster.stable_offsets(group) == {0: 4, 1: RECORDS}


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["--shift-by", "1", "--partitions", "0,1"],
            "INVALID_REQUEST: cannot shift the offset of ",
        ),
        (["--to-offset", "500"], "OFFSET_OUT_OF_RANGE: offset 500 is past the log end"),
        (["--to-earliest", "--partitions", "9"], "UNKNOWN_TOPIC_OR_PARTITION: "),
    ],
)
async def test_a_refused_reset_is_one_line_naming_the_error_and_changes_nothing(
    cli_cluster: CliCluster, capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    group = cli_cluster.group("cli-refused")
    await cli_cluster.commit(group, 0, offset=STORED[0])
    reset = admin(cli_cluster, "reset", group, "--topic", cli_cluster.topic, *argv, "--execute")
    assert await run_cli(*reset) == 1
    printed = capsys.readouterr()
    assert printed.err.startswith(f"keyrange: {cli_cluster.url} answered {error}"), printed.err
    assert printed.err.count("\n") == 1 and printed.out == ""
    assert await cli_cluster.stable_offsets(group) == {0: STORED[0]}


async def test_a_group_with_live_members_is_refused(
    cli_cluster: CliCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    group = await idle_group(cli_cluster)
    joined = await cli_cluster.api.post(
        f"/v1/groups/{group}/heartbeat",
        json={"member_epoch": 0, "subscribed_topics": [cli_cluster.topic]},
    )
    assert joined.status_code == 200, joined.text
    try:
        reset = admin(cli_cluster, "reset", group, "--topic", cli_cluster.topic, "--to-earliest")
        assert await run_cli(*reset) == 1
        error = capsys.readouterr().err
        assert error.startswith(f"keyrange: {cli_cluster.url} answered GROUP_NOT_EMPTY: ")
    finally:
        await _leave(cli_cluster.api, group, joined.json()["member_id"])


async def _leave(api: httpx.AsyncClient, group: str, member_id: str) -> None:
    left = await api.post(
        f"/v1/groups/{group}/heartbeat", json={"member_id": member_id, "member_epoch": -1}
    )
    assert left.status_code == 200, left.text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--to-earliest", "--to-latest"], "not allowed with argument"),
        (["--dry-run", "--execute"], "not allowed with argument"),
        (["--to-datetime", "yesterday"], "expected an ISO 8601 time"),
        (["--partitions", ","], "expected comma-separated partition numbers"),
    ],
)
def test_arguments_that_cannot_go_together_are_refused_before_asking(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["admin", "--url", "http://127.0.0.1:1", "reset", "g", "--topic", "t", *argv])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error


async def test_an_empty_partition_list_is_refused_not_read_as_all(cli_cluster: CliCluster) -> None:
    group = await idle_group(cli_cluster)
    refused = await cli_cluster.api.post(
        f"/v1/admin/groups/{group}/offsets/reset",
        json={"topic": cli_cluster.topic, "partitions": [], "to_earliest": True},
    )
    assert (refused.status_code, refused.json()["error"]) == (400, "INVALID_REQUEST")
    assert await cli_cluster.stable_offsets(group) == STORED
