"""``keyrange admin`` against a real coordinator and broker: aligned tables by default, the
API's reply untouched with ``--output json``, a describe that lists who owns each key range of
a partition three live members share, one-line errors naming the error, and the waiting line
on a terminal only."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import select
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from client.cli import main
from coordinator.admin_cli.progress import Progress
from coordinator.kafka import ClusterMetadata
from tests.admin.conftest import ADMIN_TOKEN, RECORDS, CliCluster
from tests.e2e.harness import produce
from tests.fixtures.coordinator import free_port
from tests.ui.conftest import HeartbeatingMember, commit, owners
from tests.waiting import until

HASH_SPACE = 2**63
MEMBERS = 3
STABLE_OFFSET = 10
IC_RANGE = (15, 17)
# Lag leaves out the offsets committed individually above the stable offset.
LAG = RECORDS - STABLE_OFFSET - (IC_RANGE[1] - IC_RANGE[0] + 1)
WATERMARK = (0, 2**62 - 1, 20)


async def run_cli(*argv: str) -> int:
    """The CLI is synchronous; a thread keeps the coordinator on this loop serving it."""
    return await asyncio.to_thread(main, list(argv))


def admin(cluster: CliCluster, *argv: str) -> list[str]:
    return ["admin", "--url", cluster.url, "--token", ADMIN_TOKEN, *argv]


Table = list[list[str]]


def tables(printed: str) -> list[Table]:
    """The blank-line-separated tables of a printout, each a list of rows of cells; every
    column must line up (all its cells start, or all end, at one column of the text)."""
    found = []
    for block in printed.strip().split("\n\n"):
        lines = block.splitlines()
        spans = [[m.span() for m in re.finditer(r"\S+(?: \S+)*", line)] for line in lines]
        assert len({len(row) for row in spans}) == 1, f"ragged table:\n{block}"
        for column in zip(*spans, strict=True):
            starts, ends = {start for start, _ in column}, {end for _, end in column}
            assert len(starts) == 1 or len(ends) == 1, f"a column is not aligned:\n{block}"
        found.append([[line[a:b] for a, b in row] for line, row in zip(lines, spans, strict=True)])
    return found


def rows_by(table: Table, *key: str) -> list[dict[str, str]]:
    header, *rows = table
    assert tuple(header[: len(key)]) == key, header
    return [dict(zip(header, row, strict=True)) for row in rows]


@pytest_asyncio.fixture(scope="module")
async def shared_members(
    cli_cluster: CliCluster, kafka_bootstrap: str, cluster_metadata: ClusterMetadata
) -> AsyncIterator[tuple[str, str, list[HeartbeatingMember]]]:
    """A group of three live members sharing the one partition of its topic, with offsets, an
    IC range and a watermark piece stored there: the group, the topic, the members."""
    api = cli_cluster.api
    topic = cli_cluster.group("cli-shared")
    await cluster_metadata.create_topic(topic, 1)
    await produce(kafka_bootstrap, topic, [b"key-%d" % i for i in range(RECORDS)])
    reply = await api.put(f"/v1/admin/topics/{topic}/config", json={"accept_range_fetch": True})
    assert reply.status_code == 200, reply.text
    group = cli_cluster.group("cli-live")
    await commit(api, group, topic, offset=STABLE_OFFSET)
    await commit(api, group, topic, ranges=[list(IC_RANGE)], watermarks=[list(WATERMARK)])
    members = [HeartbeatingMember(api, group, topic, f"worker-{i}") for i in range(MEMBERS)]
    for member in members:
        await member.start()

    async def shared() -> bool:
        owned = owners((await api.get(f"/v1/admin/groups/{group}")).json())
        return len(owned) == MEMBERS and all(owned.values())

    try:
        await until(shared, 30, "three members sharing the partition")
        yield group, topic, members
    finally:
        for member in members:
            await member.stop()


@pytest.fixture(scope="module")
def shared_group(
    shared_members: tuple[str, str, list[HeartbeatingMember]],
) -> tuple[str, str, list[str]]:
    """The shared group, its topic and its members' ids."""
    group, topic, members = shared_members
    return group, topic, [str(member.member_id) for member in members]


async def test_describe_shows_offsets_lag_and_the_owner_of_every_key_range(
    cli_cluster: CliCluster,
    shared_group: tuple[str, str, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    group, topic, member_ids = shared_group
    assert await run_cli(*admin(cli_cluster, "describe", group)) == 0
    summary, offsets, ranges, members = tables(capsys.readouterr().out)

    assert rows_by(summary, "GROUP")[0]["MEMBERS"] == str(MEMBERS)
    (partition,) = rows_by(offsets, "TOPIC", "PARTITION")
    assert partition == {
        "TOPIC": topic,
        "PARTITION": "0",
        "STABLE-OFFSET": str(STABLE_OFFSET),
        "HIGH-WATERMARK": str(RECORDS),
        "LAG": str(LAG),
        "IC-RANGES": "1",
        "WATERMARK-PIECES": "1",
        "IC-OFFSETS": str(IC_RANGE[1] - IC_RANGE[0] + 1),
        "OLDEST-UNPROCESSED-S": partition["OLDEST-UNPROCESSED-S"],
    }
    assert float(partition["OLDEST-UNPROCESSED-S"]) >= 0
    zero = rows_by(ranges, "TOPIC", "PARTITION")
    assert {row["MEMBER-ID"] for row in zero} == set(member_ids)
    assert {row["CLIENT-ID"] for row in zero} == {f"worker-{i}" for i in range(MEMBERS)}
    bounds = [tuple(int(end) for end in row["KEY-RANGE"].strip("[]").split(", ")) for row in zero]
    # In hash order, each range starts where the one before ended: the rows cover the space.
    assert bounds[0][0] == 0 and bounds[-1][1] == HASH_SPACE - 1
    assert all(later[0] == earlier[1] + 1 for earlier, later in itertools.pairwise(bounds))
    assert {row["MEMBER-ID"] for row in rows_by(members, "MEMBER-ID")} == set(member_ids)


async def test_describe_lists_stuck_calls_with_their_member_key_offset_and_age(
    cli_cluster: CliCluster,
    shared_members: tuple[str, str, list[HeartbeatingMember]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    group, topic, heartbeating = shared_members
    holder = heartbeating[1]
    key_hash = 2**62 + 5
    holder.report_stuck(
        [{"topic": topic, "partition": 0, "key_hash": key_hash, "offset": 33, "running_s": 61.5}]
    )

    async def described_calls() -> list[dict[str, object]]:
        reply = (await cli_cluster.api.get(f"/v1/admin/groups/{group}")).json()
        return [call for member in reply["members"] for call in member["stuck"]]

    await until(described_calls, 30, "the stuck call to be reported")
    try:
        assert await run_cli(*admin(cli_cluster, "describe", group)) == 0
        *_, members, stuck = tables(capsys.readouterr().out)
        assert len(rows_by(members, "MEMBER-ID")) == MEMBERS
        (row,) = rows_by(stuck, "MEMBER-ID")
        running_for, age = float(row.pop("RUNNING-FOR-S")), float(row.pop("REPORT-AGE-S"))
        assert row == {
            "MEMBER-ID": str(holder.member_id),
            "CLIENT-ID": "worker-1",
            "HOST": "127.0.0.1",
            "TOPIC": topic,
            "PARTITION": "0",
            "KEY-HASH": str(key_hash),
            "OFFSET": "33",
        }
        assert 0 <= age < 30
        assert running_for == pytest.approx(61.5 + age, abs=0.11)
    finally:
        holder.report_stuck([])

        async def cleared() -> bool:
            return not await described_calls()

        await until(cleared, 30, "the stuck call to be cleared")
    assert await run_cli(*admin(cli_cluster, "describe", group)) == 0
    assert len(tables(capsys.readouterr().out)) == 4, "no stuck table when nothing is stuck"


async def test_json_output_is_the_api_reply_as_it_came(
    cli_cluster: CliCluster,
    shared_group: tuple[str, str, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    group, _, member_ids = shared_group
    assert await run_cli(*admin(cli_cluster, "groups", "--output", "json")) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == (await cli_cluster.api.get("/v1/admin/groups")).json()

    assert await run_cli(*admin(cli_cluster, "-o", "json", "describe", group)) == 0
    described = json.loads(capsys.readouterr().out)
    assert {member["member_id"] for member in described["members"]} == set(member_ids)
    assert described["partitions"][0]["lag"] == LAG


async def test_groups_and_offsets_print_aligned_tables(
    cli_cluster: CliCluster,
    shared_group: tuple[str, str, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    group, _, _ = shared_group
    assert await run_cli(*admin(cli_cluster, "groups")) == 0
    (listed,) = tables(capsys.readouterr().out)
    row = next(row for row in rows_by(listed, "GROUP") if row["GROUP"] == group)
    assert (row["STATE"], row["MEMBERS"]) == ("stable", str(MEMBERS))

    assert await run_cli(*admin(cli_cluster, "offsets", group)) == 0
    (offsets,) = tables(capsys.readouterr().out)
    assert [row["LAG"] for row in rows_by(offsets, "TOPIC")] == [str(LAG)]

    assert await run_cli(*admin(cli_cluster, "config")) == 0
    (switches,) = tables(capsys.readouterr().out)
    assert {r["SWITCH"]: r["VALUE"] for r in rows_by(switches, "SWITCH")} == {
        "accept_individual_commit": "true",
        "default_accept_range_fetch": "false",
    }


async def test_url_may_follow_the_admin_subcommand(
    cli_cluster: CliCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("admin", "config", "--url", cli_cluster.url, "--token", ADMIN_TOKEN, "-o", "json")
    code = await run_cli(*argv)
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert json.loads(printed.out)["accept_individual_commit"] is True


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (("describe", "no spaces allowed"), "INVALID_REQUEST: group_id: "),
        (("describe", "no-such-group"), "GROUP_ID_NOT_FOUND: group 'no-such-group'"),
        (("remove-member", "no-such-group", "m-1"), "GROUP_ID_NOT_FOUND: "),
    ],
)
async def test_an_error_is_one_line_naming_the_error_and_the_coordinator_asked(
    cli_cluster: CliCluster,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    error: str,
) -> None:
    code = await run_cli(*admin(cli_cluster, *argv))
    printed = capsys.readouterr()
    assert code == 1
    assert printed.out == ""
    assert printed.err.startswith(f"keyrange: {cli_cluster.url} answered {error}")
    assert printed.err.count("\n") == 1
    assert "path." not in printed.err


async def test_a_wrong_token_is_named(
    cli_cluster: CliCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await run_cli("admin", "--url", cli_cluster.url, "--token", "wrong", "groups")
    assert code == 1
    assert capsys.readouterr().err.startswith(f"keyrange: {cli_cluster.url} answered UNAUTHORIZED")


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://coordinator", "http://[::1"])
def test_a_url_that_is_no_coordinator_url_is_refused_before_asking(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["admin", "--url", url, "groups"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert f"argument --url: {url!r} is not" in error and "Traceback" not in error


async def test_an_unreachable_coordinator_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    code = await run_cli("admin", "groups", "--url", nowhere)
    assert code == 1
    assert capsys.readouterr().err.startswith(
        f"keyrange: cannot reach the coordinator at {nowhere}: "
    )


def test_the_waiting_line_shows_on_a_terminal_only() -> None:
    controller, terminal_end = os.openpty()
    read_end, write_end = os.pipe()
    seen = b""
    with (
        open(terminal_end, "w") as terminal,
        open(write_end, "w") as pipe,
        Progress("planning the reset", terminal),
        Progress("planning the reset", pipe),
    ):
        deadline = time.monotonic() + 10
        while b"planning the reset" not in seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no waiting line on the terminal: {seen!r}"
            if select.select([controller], [], [], remaining)[0]:
                seen += os.read(controller, 4096)
    # Its write end closed, the pipe reads as empty: nothing went to what is not a terminal.
    assert os.read(read_end, 4096) == b""
    os.close(read_end)
    os.close(controller)
