"""This process's state: one store backend per (store, partition), shared by the tasks that
hold key ranges of that partition, with its checkpoint of changelog offsets per key range.

The checkpoint's rule: for each key range listed, the local backend holds every changelog
entry of that range below the listed offset. It is loaded when a backend is opened, used by
the first restoration of a range it covers, and rewritten at each commit from the ranges
held then (a range's offset is the changelog's end as last restored or written by this
process, which no other process writes for the range while this one holds it). A standby
range (docs/streams.md, "Standby key ranges") is listed with the changelog offset its tailing
reached, never more: another process writes its keys.
"""

from __future__ import annotations

import logging
from pathlib import Path

from client.protocol.keyspace import KeyRange
from client.streams.checkpoint import Checkpoint, read_checkpoint, start_offset, write_checkpoint
from client.streams.stores import BytesStore, delete_ranges, open_backend
from client.streams.topology import BuiltTopology
from client.streams.window_store import open_window_backend

logger = logging.getLogger(__name__)

StoreKey = tuple[str, int]


class StateManager:
    def __init__(self, topology: BuiltTopology, state_dir: Path | None) -> None:
        self._topology = topology
        self._state_dir = state_dir
        self._backends: dict[StoreKey, BytesStore] = {}
        self._loaded: dict[StoreKey, Checkpoint] = {}
        self._held: dict[StoreKey, Checkpoint] = {}
        # Standby ranges: kept warm from the changelog, owned by another instance.
        self._standby: dict[StoreKey, Checkpoint] = {}
        self._written: dict[tuple[str, int], int] = {}

    def backend(self, store: str, partition: int) -> BytesStore:
        key = (store, partition)
        backend = self._backends.get(key)
        if backend is None:
            spec = self._topology.stores[store]
            directory = self._directory(store, partition)
            backend = (
                open_window_backend(spec, directory)
                if spec.windowed
                else open_backend(spec, directory)
            )
            self._backends[key] = backend
            if spec.persistent and directory is not None:
                self._loaded[key] = read_checkpoint(directory / "checkpoint")
        return backend

    def restore_from(self, store: str, partition: int, keys: KeyRange) -> int:
        """Where restoring ``keys`` starts: a range this process holds already (the rest of a
        task split by a revocation), a standby of it or a checkpointed one is read on from its
        offset; otherwise its local keys are deleted (they may be stale) and it is read from 0."""
        backend = self.backend(store, partition)
        held = self._held.get((store, partition), {})
        standby = self._standby.get((store, partition), {})
        # The last: a range grown over a standby (its own range and the one it took over).
        for checkpoint in (
            held,
            standby,
            self._loaded.get((store, partition), {}),
            {**standby, **held},
        ):
            offset = start_offset(checkpoint, keys)
            if offset is not None:
                return offset
        delete_ranges(backend, [keys])
        return 0

    def restart(self, application_id: str, store: str, partition: int, keys: KeyRange) -> None:
        """``keys`` are restored again from the changelog's log start, their local state and
        any checkpoint of them being of a log that is gone. Checkpoint first, as ``drop``."""
        for kept in (self._held, self._standby, self._loaded):
            self._forget_overlapping(kept, store, partition, keys)
        self._write_checkpoint(application_id, store, partition)
        delete_ranges(self.backend(store, partition), [keys])

    def restored(self, store: str, partition: int, keys: KeyRange, end_offset: int) -> None:
        """An active task's ``keys`` are restored up to ``end_offset``: a standby of them, if
        any, became this task's state."""
        self._held.setdefault((store, partition), {})[keys] = end_offset
        self._forget_overlapping(self._standby, store, partition, keys)
        # A checkpointed range is used once: after this, the live state is the truth.
        self._forget_overlapping(self._loaded, store, partition, keys)

    def standby_at(self, store: str, partition: int, keys: KeyRange, offset: int) -> None:
        """A standby of ``keys`` holds every changelog entry of them below ``offset``."""
        self._standby.setdefault((store, partition), {})[keys] = offset
        self._forget_overlapping(self._loaded, store, partition, keys)

    def standby_offset(self, store: str, partition: int, keys: KeyRange) -> int | None:
        """Where the standby of exactly ``keys`` stands (None: there is none)."""
        return self._standby.get((store, partition), {}).get(keys)

    def drop_standby(
        self, application_id: str, store: str, partition: int, keys: KeyRange, *, delete: bool
    ) -> None:
        """Forget the standby of ``keys``; ``delete`` removes their local data too (not when
        an active task of this process holds them). Checkpoint first, as ``drop``."""
        if self._standby.get((store, partition), {}).pop(keys, None) is None:
            return
        self._write_checkpoint(application_id, store, partition)
        if delete:
            delete_ranges(self.backend(store, partition), [keys])

    @staticmethod
    def _forget_overlapping(
        kept: dict[StoreKey, Checkpoint], store: str, partition: int, keys: KeyRange
    ) -> None:
        checkpoint = kept.get((store, partition))
        if checkpoint is not None:
            kept[(store, partition)] = {
                covered: offset
                for covered, offset in checkpoint.items()
                if not covered.overlaps(keys)
            }

    def note_written(self, changelog: str, partition: int, offset: int) -> None:
        key = (changelog, partition)
        if offset + 1 > self._written.get(key, 0):
            self._written[key] = offset + 1

    def flush(self) -> None:
        for backend in self._backends.values():
            backend.flush()

    def held_offset(self, store: str, partition: int, changelog: str) -> int:
        """The changelog's end as this process knows it (restored or written)."""
        held = self._held.get((store, partition), {})
        return max([*held.values(), self._written.get((changelog, partition), 0)])

    def hold(self, store: str, partition: int, keys: KeyRange, offset: int) -> None:
        self._held.setdefault((store, partition), {})[keys] = offset

    def write_checkpoints(self, application_id: str) -> None:
        for store, partition in {*self._held, *self._standby}:
            self._write_checkpoint(application_id, store, partition)

    def drop(
        self, application_id: str, store: str, partition: int, keys: KeyRange, *, delete: bool
    ) -> None:
        """Forget ``keys`` of this store partition; ``delete`` removes their local data too.
        The checkpoint is rewritten first, so no crash leaves it naming deleted keys."""
        held = self._held.get((store, partition), {})
        for covered in [covered for covered in held if covered.overlaps(keys)]:
            held.pop(covered)
        self._write_checkpoint(application_id, store, partition)
        if delete:
            delete_ranges(self.backend(store, partition), [keys])

    def _write_checkpoint(self, application_id: str, store: str, partition: int) -> None:
        directory = self._directory(store, partition)
        if directory is None or not self._topology.stores[store].persistent:
            return
        changelog = self._topology.stores[store].changelog_topic(application_id)
        written = self._written.get((changelog, partition), 0)
        held = self._held.get((store, partition), {})
        current = {keys: max(offset, written) for keys, offset in held.items()}
        self._held[(store, partition)] = current
        # A standby's offset is where its tailing reached: this process's own writes to the
        # changelog say nothing of another instance's keys.
        standby = self._standby.get((store, partition), {})
        write_checkpoint(directory / "checkpoint", {**standby, **current})

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()

    def _directory(self, store: str, partition: int) -> Path | None:
        if self._state_dir is None:
            return None
        return self._state_dir / store / f"partition-{partition}"
