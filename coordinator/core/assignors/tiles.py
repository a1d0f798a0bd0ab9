"""Runs of whole tiles: how the sticky stream-join assignor holds a shared partition number's
hash space (``coordinator.core.assignors.sticky_join``, "Split numbers"). A run is an inclusive
pair of tile indexes; lists of runs are kept sorted and disjoint."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from client.protocol.keyspace import KeyRange

Run = tuple[int, int]  # inclusive tile indexes


def majority_runs(held: list[list[KeyRange]], tile_size: int) -> list[list[Run]]:
    """Per member, the tiles it holds: whole tiles it held, and a tile held in parts (after a
    re-cut of the grid, or ranges from another assignor) goes to whoever held most of it."""
    runs: list[list[Run]] = [[] for _ in held]
    partial: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for index, ranges in enumerate(held):
        for keys in ranges:
            first_full = -(-keys.start // tile_size)
            last_full = (keys.end + 1) // tile_size - 1
            if first_full <= last_full:
                runs[index].append((first_full, last_full))
            for tile in {keys.start // tile_size, keys.end // tile_size}:
                if not first_full <= tile <= last_full:
                    start = max(keys.start, tile * tile_size)
                    end = min(keys.end, (tile + 1) * tile_size - 1)
                    partial[tile].append((end - start + 1, index))
    for tile, pieces in partial.items():
        amounts: dict[int, int] = defaultdict(int)
        for amount, index in pieces:
            amounts[index] += amount
        winner = min(amounts, key=lambda index: (-amounts[index], index))
        runs[winner].append((tile, tile))
    return [merge_runs(member_runs) for member_runs in runs]


def full_tiles(ranges: list[KeyRange], tile_size: int) -> list[Run]:
    """The tiles wholly inside ``ranges``."""
    runs = []
    for keys in ranges:
        first, last = -(-keys.start // tile_size), (keys.end + 1) // tile_size - 1
        if first <= last:
            runs.append((first, last))
    return merge_runs(runs)


def common_count(left: list[Run], right: list[Run]) -> int:
    """Tiles in both sorted, disjoint run lists."""
    common = 0
    i = j = 0
    while i < len(left) and j < len(right):
        common += max(0, min(left[i][1], right[j][1]) - max(left[i][0], right[j][0]) + 1)
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1
    return common


def merge_runs(runs: Iterable[Run]) -> list[Run]:
    merged: list[Run] = []
    for first, last in sorted(runs):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def run_count(runs: list[Run]) -> int:
    return sum(last - first + 1 for first, last in runs)


def prefix_runs(runs: list[Run], quota: int) -> list[Run]:
    kept: list[Run] = []
    for first, last in runs:
        if quota <= 0:
            break
        length = min(last - first + 1, quota)
        kept.append((first, first + length - 1))
        quota -= length
    return kept


def complement(runs: list[Run], tiles: int) -> list[Run]:
    free: list[Run] = []
    cursor = 0
    for first, last in runs:
        if first > cursor:
            free.append((cursor, first - 1))
        cursor = max(cursor, last + 1)
    if cursor < tiles:
        free.append((cursor, tiles - 1))
    return free


class FreeTiles:
    """Free tile runs, found by either end so a member can grow its own runs first."""

    def __init__(self, runs: list[Run]) -> None:
        self._last_of = dict(runs)
        self._first_of = {last: first for first, last in runs}

    def extend_adjacent(self, runs: list[Run], wanted: int) -> list[Run]:
        grown = list(runs)
        for index, (first, last) in enumerate(runs):
            if wanted <= 0:
                break
            free_last = self._last_of.get(last + 1)
            if free_last is not None:
                taken = min(wanted, free_last - last)
                self._remove(last + 1, free_last)
                if last + 1 + taken <= free_last:
                    self._add(last + 1 + taken, free_last)
                last += taken
                wanted -= taken
            free_first = self._first_of.get(first - 1)
            if wanted > 0 and free_first is not None:
                taken = min(wanted, first - free_first)
                self._remove(free_first, first - 1)
                if free_first <= first - 1 - taken:
                    self._add(free_first, first - 1 - taken)
                first -= taken
                wanted -= taken
            grown[index] = (first, last)
        return merge_runs(grown)

    def take_within(self, within: list[Run], wanted: int) -> list[Run]:
        """Up to ``wanted`` free tiles inside ``within`` (sorted, disjoint), lowest first."""
        taken: list[Run] = []
        for low, high in within:
            for first in sorted(self._last_of):
                last = self._last_of[first]
                start, end = max(first, low), min(last, high, max(first, low) + wanted - 1)
                if wanted <= 0 or start > end:
                    continue
                self._remove(first, last)
                if first < start:
                    self._add(first, start - 1)
                if end < last:
                    self._add(end + 1, last)
                taken.append((start, end))
                wanted -= end - start + 1
        return taken

    def take_lowest(self, wanted: int) -> list[Run]:
        taken: list[Run] = []
        while wanted > 0:
            first = min(self._last_of)
            last = self._last_of[first]
            length = min(wanted, last - first + 1)
            self._remove(first, last)
            if first + length <= last:
                self._add(first + length, last)
            taken.append((first, first + length - 1))
            wanted -= length
        return taken

    def _add(self, first: int, last: int) -> None:
        self._last_of[first] = last
        self._first_of[last] = first

    def _remove(self, first: int, last: int) -> None:
        del self._last_of[first]
        del self._first_of[last]
