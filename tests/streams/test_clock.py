"""Stream time, the next-record choice and idle waits (KIP-28 synchronization); pausing is
the byte budget's (tests/runtime/test_budget.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from client.streams.clock import NO_TIME, TaskInputs, Wait


def test_the_lowest_timestamp_among_the_heads_goes_first() -> None:
    inputs = TaskInputs(["orders", "customers"])
    inputs.add("orders", 30, "o30")
    inputs.add("customers", 10, "c10")
    inputs.add("customers", 40, "c40")
    taken = []
    while (choice := inputs.choose(0)) is not None:
        assert not isinstance(choice, Wait)
        taken.append(choice[1].record)
    assert taken == ["c10", "o30", "c40"]


def test_an_empty_input_is_waited_for_up_to_the_idle_time() -> None:
    inputs = TaskInputs(["orders", "customers"], max_idle_ms=100)
    inputs.add("orders", 5, "o5")
    assert inputs.choose(1_000) == Wait(1_100)
    assert inputs.choose(1_050) == Wait(1_100)
    choice = inputs.choose(1_100)
    assert not isinstance(choice, Wait) and choice is not None
    assert choice[1].record == "o5"


def test_stream_time_is_the_largest_partition_time_and_never_goes_back() -> None:
    inputs = TaskInputs(["a", "b"])
    assert inputs.stream_time == NO_TIME
    for name, timestamp in [("a", 100), ("b", 50), ("a", 20), ("b", 200)]:
        inputs.add(name, timestamp, None)
    times = []
    while (choice := inputs.choose(0)) is not None:
        assert not isinstance(choice, Wait)
        times.append(inputs.stream_time)
    assert inputs.partition_time("a") == 100
    assert inputs.partition_time("b") == 200
    assert times == sorted(times)
    assert inputs.stream_time == 200


def test_a_quiet_input_holds_stream_time_back_no_more() -> None:
    # A join's table delivered once, then went quiet: the stream's records move time on.
    inputs = TaskInputs(["orders", "customers"])
    inputs.add("customers", 10, None)
    inputs.add("orders", 20, None)
    inputs.add("orders", 500, None)
    while inputs.choose(0) is not None:
        pass
    assert inputs.partition_time("customers") == 10
    assert inputs.stream_time == 500


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(min_value=0, max_value=10_000))
    )
)
def test_stream_time_is_monotonic_and_every_record_comes_out_once(
    arrivals: list[tuple[str, int]],
) -> None:
    inputs = TaskInputs(["a", "b", "c"])
    for index, (name, timestamp) in enumerate(arrivals):
        inputs.add(name, timestamp, index)
    seen: list[int] = []
    last = NO_TIME
    while (choice := inputs.choose(0)) is not None:
        assert not isinstance(choice, Wait)
        assert inputs.stream_time >= last
        last = inputs.stream_time
        seen.append(choice[1].record)
    assert sorted(seen) == list(range(len(arrivals)))
    # Per input, records keep their arrival (offset) order.
    for name in "abc":
        own = [index for index in seen if arrivals[index][0] == name]
        assert own == sorted(own)
