"""``StreamsApp``: a topology run as a member of its application's group.

One ``KeyrangeConsumer`` per process (one Kafka consumer, one membership with the sticky
stream-join assignor, so every co-partitioned topic's partition ``p`` comes with the same key
ranges), one producer for sinks and changelogs, one restorer with a Kafka connection of its
own, and the runtime (``client.streams.runtime``) driving the tasks. ``StreamsApp`` is the
composition root: it registers the runtime with the consumer's lifecycle hooks
(``client.runtime.hooks``), through which the runtime opens the tasks of assigned slices,
closes those of revoked ones and drops those of lost ones. Shut down gracefully: the runtime
finishes and runs the commit protocol, the consumer commits and leaves, the tasks close and
checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from client.consumer import KeyrangeConsumer
from client.consumer_source import ConsumerSource
from client.errors import KeyrangeClientError
from client.graceful import GracefulStop
from client.http import CoordinatorClient
from client.metrics_server import Family, MetricsServer
from client.streams.config import StreamsConfig
from client.streams.errors import StreamsError
from client.streams.internal import (
    changelog_configs,
    external_topics,
    for_application,
    plan_internal_topics,
)
from client.streams.lifecycle import Opening
from client.streams.metrics import EXTRA as METRICS_EXTRA
from client.streams.metrics import streams_families
from client.streams.outputs import MAX_REQUEST_SIZE
from client.streams.queries import QueryAnswer, StoreQueries
from client.streams.query_server import QueryServer
from client.streams.restore import RestoreProgress, Restorer
from client.streams.runtime import StreamsRuntime
from client.streams.standby import Standbys, standbys_running
from client.streams.state import StateManager
from client.streams.state_dir import StateDirectory
from client.streams.task import TaskId, TaskState
from client.streams.topology import BuiltTopology, Topology
from client.tracing import record_tracer

ASSIGNOR = "sticky-join"
logger = logging.getLogger(__name__)


class StreamsApp:
    def __init__(self, topology: Topology | BuiltTopology, config: StreamsConfig) -> None:
        built = topology.build() if isinstance(topology, Topology) else topology
        self.topology = for_application(built, config.application_id)
        self.config = config
        # One set of aiokafka arguments (secrets in clear: passed on, never logged) for the
        # consumer, the producer, the restorer and the admin client alike.
        security = config.kafka_security.aiokafka_options()
        self._kafka: dict[str, object] = {"bootstrap_servers": config.bootstrap_servers, **security}
        # Shared by the consumer and the owner look-ups of ``query``: one connection pool,
        # the client's retries and its error mapping; closed when ``run`` ends.
        self._coordinator = CoordinatorClient(config.coordinator_url, token=config.token)
        self._consumer = KeyrangeConsumer(
            *self.topology.source_topics,
            bootstrap_servers=config.bootstrap_servers,
            coordinator_url=config.coordinator_url,
            group_id=config.application_id,
            token=config.token,
            assignor=ASSIGNOR,
            session_timeout_ms=config.session_timeout_ms,
            auto_commit_interval_ms=None,
            instance_id=config.instance_id,
            revoke_timeout_s=config.revoke_timeout_s,
            coordinator=self._coordinator,
            **{**security, **config.consumer_options},
        )
        self._state_directory = StateDirectory(
            config.state_dir / config.application_id, config.instance_id
        )
        # Replaced by ``run`` once this instance's own directory is locked; nothing opens a
        # store before then.
        self._state = StateManager(self.topology, None)
        self.runtime: StreamsRuntime | None = None
        self._producer: AIOKafkaProducer | None = None
        self._restorer: Restorer | None = None
        self._standby_restorer: Restorer | None = None
        self._standby_set: Standbys | None = None
        self._graceful = GracefulStop("streams", config.application_id)
        self._partitions: dict[str, int] = {}
        interactive = sys.stderr.isatty() if config.show_progress is None else config.show_progress
        self._show_progress = interactive
        self._queries = StoreQueries(
            self.topology,
            config.application_id,
            self._coordinator,
            self._partitions,
            lambda: self.runtime,
        )
        self._query_server = (
            None
            if config.query_port is None
            else QueryServer(config.query_host, config.query_port, config.query_advertised_url)
        )

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask for a graceful shutdown; ``run`` returns once it is done."""
        self._graceful.request()

    async def run(self, *, handle_signals: bool = False) -> None:
        metrics = _metrics_server(
            self.config, lambda: streams_families(self.metrics(), self.budget_figures())
        )
        try:
            with self._graceful.signals_handled(handle_signals):
                self._state = StateManager(self.topology, self._state_directory.claim())
                await self._create_changelogs()
                self._serve_queries()
                self._producer, self._restorer = self._connections()
                await self._producer.start()
                try:
                    await self._restorer.start()
                    if self.config.num_standby_replicas > 0:
                        self._standby_restorer = Restorer(self._kafka)
                        await self._standby_restorer.start()
                        self._standby_set = self._standbys(self._standby_restorer)
                    async with self._consumer, standbys_running(self._standby_set):
                        await self._graceful.drive(
                            self._consumer,
                            self._make_runtime,
                            stopping="committing, then leaving the group",
                        )
                        # A send that failed during the shutdown: committed nothing after it,
                        # and is this run's outcome.
                        if self.runtime is not None and self.runtime.failure is not None:
                            raise self.runtime.failure
                finally:
                    if self.runtime is not None:
                        self._consumer.hooks.unregister(self.runtime)
                    await self._restorer.stop()
                    if self._standby_restorer is not None:
                        await self._standby_restorer.stop()
                    await self._producer.stop()
                    self._state.close()
        finally:
            self._state_directory.release()
            if self._query_server is not None:
                await self._query_server.stop()
            await self._coordinator.aclose()
            if metrics is not None:
                metrics.close()

    def _serve_queries(self) -> None:
        """Listen before joining: the join advertises the address."""
        if self._query_server is None:
            return
        self._query_server.start(
            self._queries,
            coordinator_url=self.config.coordinator_url,
            group_id=self.config.application_id,
            name=lambda: self.config.instance_id or self.member_id,
            credential=self.config.token,
        )
        self._consumer.endpoint = self._query_server.endpoint

    def _make_runtime(self, source: ConsumerSource) -> StreamsRuntime:
        assert self._producer is not None and self._restorer is not None
        self.runtime = StreamsRuntime(
            source,
            topology=self.topology,
            application_id=self.config.application_id,
            producer=self._producer,
            restorer=self._restorer,
            state=self._state,
            owned=source.slice_watermarks,
            commit=self._consumer.commit,
            commit_interval_s=self.config.commit_interval_ms / 1000,
            max_idle_ms=self.config.max_task_idle_ms,
            max_buffered_bytes=self.config.max_buffered_bytes,
            processing_threads=self.config.processing_threads,
            cache_max_bytes=self.config.cache_max_bytes,
            max_buffered_records=self.config.max_buffered_records,
            on_restore=self._restore_progress,
            tracer=record_tracer(
                "streams", self.config.application_id, lambda: self._consumer.member_id
            ),
            opening=Opening(
                before=_no_standby if self._standby_set is None else self._standby_set.release,
                starts=source.slice_starts,
            ),
        )
        self._consumer.hooks.register(self.runtime)
        # What was granted before the runtime existed, as if granted now.
        self.runtime.assigned(self._consumer.assignment())
        return self.runtime

    def _standbys(self, restorer: Restorer) -> Standbys:
        return Standbys(
            topology=self.topology,
            application_id=self.config.application_id,
            state=self._state,
            restorer=restorer,
            owners=lambda: self._coordinator.group_owners(self.config.application_id),
            member=self._consumer,
            active=lambda: [] if self.runtime is None else [task.id for task in self.runtime.tasks],
            replicas=self.config.num_standby_replicas,
        )

    def standby_status(self) -> dict[str, dict[str, Any]]:
        """Per standby range: each store's changelog position, the high watermark last seen,
        the records written since it started, and its lag in changelog records."""
        return {} if self._standby_set is None else self._standby_set.status()

    def _connections(self) -> tuple[AIOKafkaProducer, Restorer]:
        """The producer and the restorer, made in ``run``, not in ``__init__``: aiokafka's
        clients bind to the running loop."""
        producer = AIOKafkaProducer(**self._kafka, max_request_size=MAX_REQUEST_SIZE)
        return producer, Restorer(self._kafka)

    def _admin(self) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**self._kafka)

    async def _create_changelogs(self) -> None:
        """The internal topics (sized by ``plan_internal_topics``), then each store's
        changelog with its sub-topology's partition count and ``changelog_configs``."""
        admin = self._admin()
        await admin.start()
        try:
            external = external_topics(self.topology)
            described = await admin.describe_topics(external)
            for entry in described:
                if entry.get("partitions"):
                    self._partitions[entry["topic"]] = len(entry["partitions"])
            missing = [topic for topic in external if topic not in self._partitions]
            if missing:
                raise StreamsError(f"source topics do not exist: {', '.join(missing)}")
            internal = plan_internal_topics(self.topology, self._partitions)
            wanted = [
                NewTopic(topic, count, self.config.changelog_replication_factor)
                for topic, count in internal.items()
            ]
            for sub in self.topology.subtopologies:
                count = min(self._partitions[topic] for topic in sub.source_topics)
                for store in sub.stores:
                    spec = self.topology.stores[store]
                    configs = changelog_configs(spec)
                    if configs is not None:
                        name = spec.changelog_topic(self.config.application_id)
                        wanted.append(
                            NewTopic(
                                name,
                                count,
                                self.config.changelog_replication_factor,
                                topic_configs=configs,
                            )
                        )
            if wanted:
                reply = await admin.create_topics(wanted)
                for topic, code, *_ in getattr(reply, "topic_errors", ()):
                    if code not in (0, TopicAlreadyExistsError.errno):
                        raise StreamsError(f"cannot create topic {topic}: error {code}")
        finally:
            await admin.close()
        await self._split_internal_topics(internal)

    async def _split_internal_topics(self, internal: dict[str, int]) -> None:
        """Let the coordinator split the internal topics by key, as the application owns them;
        a token without the admin scope leaves that to an operator, and the topics are then
        handed out by whole partitions."""
        for topic in internal:
            try:
                await self._coordinator.set_accept_range_fetch(topic)
            except KeyrangeClientError as error:
                logger.warning(
                    "internal topic not split by key: run keyrange admin topic-config "
                    "--accept-range-fetch true on it",
                    extra={"topic": topic, "error": str(error)},
                )

    # ------------------------------------------------------------------ queries and metrics

    @property
    def member_id(self) -> str | None:
        """This instance's member id in the application's group (None until it joined)."""
        return self._consumer.member_id

    @property
    def query_endpoint(self) -> str | None:
        """Where this instance serves queries over HTTP (None without ``query_port``, or
        before ``run`` listens)."""
        server = self._query_server
        return None if server is None or not server.listening else server.endpoint

    async def query(self, store: str, key: Any) -> QueryAnswer:
        """Answer from the local store when this instance owns ``key``'s range; otherwise
        name the member that owns it and where it serves queries, from the coordinator's
        view of the group. Asked while ``run`` runs (the coordinator connection closes with
        it)."""
        return await self._queries.query(store, key)

    def metrics(self) -> dict[str, dict[str, Any]]:
        """Per task: records processed, punctuations, stream time and its lag behind the wall
        clock, buffered records, and each store's restore progress (with its failed attempts
        and, until one succeeds, why the last failed)."""
        runtime = self.runtime
        if runtime is None:
            return {}
        now_ms = int(time.time() * 1000)
        result: dict[str, dict[str, Any]] = {}
        for task_id, task in runtime.tasks.items():
            stream_time = task.inputs.stream_time
            result[str(task_id)] = {
                "records": task.metrics.records,
                "punctuations": task.metrics.punctuations,
                "stream_time": stream_time,
                "stream_time_lag_ms": None if stream_time < 0 else now_ms - stream_time,
                "buffered": task.inputs.buffered(),
                "ready": task.state is not TaskState.RESTORING,
                "restore": [progress.figures() for progress in runtime.restores.get(task_id, [])],
            }
        return result

    def budget_figures(self) -> dict[str, float]:
        """The byte budget of this instance's input: what is buffered, its bound, and how many
        partitions are paused for it."""
        runtime = self.runtime
        budget = None if runtime is None else runtime.inputs.budget
        return {
            "buffered_bytes": 0 if budget is None else budget.total,
            "buffered_bytes_bound": self.config.max_buffered_bytes,
            "paused_partitions": 0 if budget is None else len(budget.paused),
        }

    def _restore_progress(self, progress: RestoreProgress) -> None:
        if not self._show_progress:
            return
        width = 30
        filled = int(progress.fraction * width)
        bar = "#" * filled + "-" * (width - filled)
        end = "\n" if progress.done else ""
        sys.stderr.write(
            f"\rrestoring {progress.store}[{progress.partition}] [{bar}] "
            f"{progress.fraction:6.1%} read {progress.read} restored {progress.restored}{end}"
        )
        sys.stderr.flush()


def _no_standby(task: TaskId) -> None:
    """Without standbys, nothing stops before a task's restore."""


def _metrics_server(
    config: StreamsConfig, families: Callable[[], list[Family]]
) -> MetricsServer | None:
    """The Prometheus port when ``metrics_port`` asks for one, on the running loop."""
    if config.metrics_port is None:
        return None
    return MetricsServer(
        config.metrics_port,
        families,
        asyncio.get_running_loop(),
        extra=METRICS_EXTRA,
        host=config.metrics_host,
    )
