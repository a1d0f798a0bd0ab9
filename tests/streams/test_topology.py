"""The topology builder: valid graphs build into sub-topologies, invalid ones fail naming
the node at fault."""

from __future__ import annotations

import pytest

from client.streams import Processor, StoreSpec, Topology, TopologyError
from client.streams.serde import INT64, JSON, STRING


class Noop(Processor):
    def process(self, key: object, value: object) -> None:
        self.context.forward(key, value)


def join_topology() -> Topology:
    return (
        Topology()
        .add_source("orders", "orders-topic", value_serde=JSON)
        .add_source("customers", "customers-topic", value_serde=JSON)
        .add_processor("remember", Noop, "customers")
        .add_processor("join", Noop, "orders")
        .add_state_store(StoreSpec("customers-store", STRING, JSON), "remember", "join")
        .add_sink("out", "enriched", "join")
    )


def test_a_shared_store_puts_two_sources_in_one_partition_group() -> None:
    built = join_topology().build()
    assert len(built.subtopologies) == 1
    assert set(built.subtopologies[0].source_topics) == {"orders-topic", "customers-topic"}
    assert built.subtopologies[0].stores == ("customers-store",)


def test_a_repartition_through_a_topic_makes_two_sub_topologies() -> None:
    built = (
        Topology()
        .add_source("lines", "lines")
        .add_processor("split", Noop, "lines")
        .add_sink("to-words", "words", "split")
        .add_source("words", "words")
        .add_processor("count", Noop, "words")
        .add_state_store(StoreSpec("counts", STRING, INT64), "count")
        .build()
    )
    assert [sub.source_topics for sub in built.subtopologies] == [("lines",), ("words",)]
    assert built.subtopology_of_topic("words").stores == ("counts",)


def test_changelog_names_derive_from_application_and_store() -> None:
    assert StoreSpec("counts").changelog_topic("wc") == "wc-counts-changelog"


@pytest.mark.parametrize(
    ("build", "names"),
    [
        (lambda t: t.add_source("s", "a").add_source("s", "b"), "source 's'"),
        (lambda t: t.add_source("s", "a").add_source("s2", "a"), "source 's2'"),
        (lambda t: t.add_source("s"), "source 's'"),
        (lambda t: t.add_source("s", "bad topic!"), "source 's'"),
        (lambda t: t.add_source("s", "a").add_processor("p", Noop, "ghost"), "processor 'p'"),
        (lambda t: t.add_source("s", "a").add_processor("p", Noop), "processor 'p'"),
        (lambda t: t.add_source("s", "a").add_processor("p", 42, "s"), "processor 'p'"),
        (
            lambda t: (
                t.add_source("s", "a").add_sink("k", "out", "s").add_processor("p", Noop, "k")
            ),
            "processor 'p'",
        ),
        (
            lambda t: t.add_source("s", "a").add_sink("k", "out", "s", key_serde=object()),
            "sink 'k'",
        ),
        (lambda t: t.add_source("s", "a").add_state_store(StoreSpec("st"), "nobody"), "store 'st'"),
        (lambda t: t.add_source("s", "a").add_state_store(StoreSpec("a b")), "store 'a b'"),
    ],
)
def test_an_invalid_node_is_named_in_the_error(build: object, names: str) -> None:
    with pytest.raises(TopologyError, match=names):
        build(Topology())  # type: ignore[operator]


@pytest.mark.parametrize(
    ("topology", "names"),
    [
        (Topology(), "no source"),
        (Topology().add_source("lonely", "a"), "source 'lonely'"),
        (
            Topology()
            .add_source("s", "a")
            .add_processor("p", Noop, "s")
            .add_state_store(StoreSpec("unused")),
            "store 'unused'",
        ),
    ],
)
def test_build_rejects_an_incomplete_graph(topology: Topology, names: str) -> None:
    with pytest.raises(TopologyError, match=names):
        topology.build()
