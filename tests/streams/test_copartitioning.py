"""Topologies that cannot work are refused before they run (issue 46, item 7): a
sub-topology's inputs are read partition by partition together, and the sticky-join assignor
hands out only the partition numbers every one of them has, so inputs of different counts
would leave partitions unread for good. Kafka Streams refuses such topologies at start-up
and sizes a repartition topic to the side it is joined with; so does Keyrange."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.streams import JSON, STRING, StreamsApp, Topology, TopologyError
from client.streams.dsl import StreamsBuilder
from client.streams.internal import for_application, plan_internal_topics
from client.streams.topology import BuiltTopology
from tests.fixtures.services import MakeTopic
from tests.streams.test_examples import config
from tests.streams.test_topology import Noop


def enrich_clicks(*, rekey: bool, partitions: int | None = None) -> BuiltTopology:
    """Clicks (re-keyed by user, when ``rekey``) joined with the users table."""
    builder = StreamsBuilder()
    users = builder.table("users", key_serde=STRING, value_serde=JSON, persistent=False)
    clicks = builder.stream("clicks", key_serde=STRING, value_serde=JSON)
    if rekey:
        clicks = clicks.map(lambda key, value: (value["user"], value), key_serde=STRING)
        clicks = clicks.repartition(partitions=partitions, name="by-user")
    clicks.join(users, lambda click, user: {**click, **user}, name="enrich").to("enriched")
    return for_application(builder.build().build(), "app")


def test_a_re_keyed_stream_joined_with_a_table_is_repartitioned_into_the_tables_count() -> None:
    """The review's topology: clicks on 6 partitions, users on 3. The base code sized the
    repartition topic by its writer (6), so partitions 3-5 were never assigned and about
    half the clicks waited for ever."""
    built = enrich_clicks(rekey=True)
    (repartition,) = built.internal_topics
    assert plan_internal_topics(built, {"clicks": 6, "users": 3}) == {repartition: 3}


def test_two_topics_of_different_counts_joined_directly_are_refused_naming_both() -> None:
    built = enrich_clicks(rekey=False)
    with pytest.raises(TopologyError) as refused:
        plan_internal_topics(built, {"clicks": 6, "users": 3})
    assert "not co-partitioned: 'clicks' has 6, 'users' has 3 partitions" in str(refused.value)


def test_a_repartition_count_declared_against_the_joined_table_is_refused() -> None:
    built = enrich_clicks(rekey=True, partitions=6)
    with pytest.raises(TopologyError, match=r"'app-by-user-repartition' has 6, 'users' has 3"):
        plan_internal_topics(built, {"clicks": 6, "users": 3})
    assert plan_internal_topics(built, {"clicks": 2, "users": 6}) == {"app-by-user-repartition": 6}


def test_sources_merged_into_one_sub_topology_must_agree_too() -> None:
    """No join, one processor reading two topics: still one task per partition number over
    both, so a 6-partition topic's partitions 3-5 would never be read."""
    built = (
        Topology()
        .add_source("a", "a-topic")
        .add_source("b", "b-topic")
        .add_processor("both", Noop, "a", "b")
        .add_sink("out", "out", "both")
        .build()
    )
    with pytest.raises(TopologyError, match=r"'a-topic' has 6, 'b-topic' has 3"):
        plan_internal_topics(built, {"a-topic": 6, "b-topic": 3})
    assert plan_internal_topics(built, {"a-topic": 3, "b-topic": 3}) == {}


def test_internal_topics_declared_with_different_counts_fail_at_build() -> None:
    topology = (
        Topology()
        .add_internal_topic("left", 6)
        .add_internal_topic("right", 3)
        .add_source("a", "a-topic")
        .add_sink("to-left", "left", "a")
        .add_sink("to-right", "right", "a")
        .add_source("l", "left")
        .add_source("r", "right")
        .add_processor("both", Noop, "l", "r")
        .add_sink("out", "out", "both")
    )
    with pytest.raises(TopologyError, match=r"'left' has 6, 'right' has 3 partitions"):
        topology.build()


def test_a_repartition_read_alone_keeps_its_writers_largest_count() -> None:
    builder = StreamsBuilder()
    builder.stream("lines", "more-lines", key_serde=STRING, value_serde=STRING).group_by(
        lambda key, line: line, key_serde=STRING, name="words"
    ).count().to_stream().to("counts")
    built = for_application(builder.build().build(), "app")
    with pytest.raises(TopologyError, match="'lines' has 4, 'more-lines' has 2"):
        plan_internal_topics(built, {"lines": 4, "more-lines": 2})
    assert plan_internal_topics(built, {"lines": 4, "more-lines": 4}) == {
        "app-words-repartition": 4
    }


async def test_an_app_on_topics_not_co_partitioned_stops_before_joining_its_group(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    clicks, users = await make_topic(6), await make_topic(3)
    builder = StreamsBuilder()
    table = builder.table(users, key_serde=STRING, value_serde=JSON, persistent=False)
    builder.stream(clicks, key_serde=STRING, value_serde=JSON).join(
        table, lambda click, user: [click, user]
    ).to("enriched")
    app = StreamsApp(
        builder.build(), config("copartition", kafka_bootstrap, coordinator_url, tmp_path)
    )
    with pytest.raises(TopologyError) as refused:
        await app.run()
    message = str(refused.value)
    assert f"'{clicks}' has 6" in message and f"'{users}' has 3" in message
    assert app.member_id is None
