"""``Worker``: a process's worker runtime. One ``KeyrangeConsumer`` (one Kafka consumer, one
membership) and one dead-letter producer per process, the runtime processing on its own
workers and pools apart from the fetch and heartbeat tasks, and the shutdown a container
platform expects: on SIGTERM or SIGINT stop fetching, let records in processing finish (up
to ``drain_timeout_s``), commit, leave the group; a second signal exits at once.

``Worker`` is the composition root: it builds the consumer, the pools and the runtime, and
registers the runtime with the consumer's lifecycle hooks (``client.runtime.hooks``), through
which it hears every ownership change and the stop until the consumer has stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from client.consumer import KeyrangeConsumer
from client.graceful import GracefulStop
from client.metrics_server import MetricsServer
from client.runtime.pools.pool import is_async
from client.runtime.seams import WorkerSource
from client.tracing import record_tracer
from client.worker.calls import Calls, Handler
from client.worker.config import WorkerConfig
from client.worker.deadletter import DeadLetters
from client.worker.metrics import EXTRA as METRICS_EXTRA
from client.worker.metrics import worker_families
from client.worker.outcomes import Stats
from client.worker.runtime import WorkerRuntime
from client.worker.task import Partitioner, WorkerTask


class Worker:
    """Runs ``task`` (a ``WorkerTask`` factory, usually its class) or ``handler`` (called
    with each record; success when it returns) over the group's records until ``stop()``, a
    signal (``handle_signals``) or a failure the policy does not absorb (``WorkerFailed``).

    Records reach user code as the broker stored them (``key`` and ``value`` are bytes), so
    a dead letter carries the exact bytes; deserialise in the task or handler.
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        task: Callable[[], WorkerTask] | None = None,
        handler: Handler | None = None,
        partitioner: Partitioner | None = None,
        producer_options: Mapping[str, Any] | None = None,
    ) -> None:
        if (task is None) == (handler is None):
            raise ValueError("give exactly one of task and handler")
        for decoding in ("key_deserializer", "value_deserializer"):
            if decoding in config.consumer_options:
                raise ValueError(
                    f"{decoding} is not supported by the worker: records stay bytes so a "
                    "dead letter carries them unchanged; deserialise in the task or handler"
                )
        if config.processes and (handler is None or is_async(handler)):
            raise ValueError("processes needs a plain (not async) handler function")
        if partitioner is not None and task is None:
            raise ValueError("a partitioner applies to tasks; a handler has a lane per key")
        self.config = config
        self._task = task
        self._handler = handler
        self._partitioner = partitioner
        security = config.kafka_security.aiokafka_options()
        self._dead_letters = (
            DeadLetters(
                config.dead_letters,
                {
                    "bootstrap_servers": config.bootstrap_servers,
                    **security,
                    **(producer_options or {}),
                },
            )
            if config.failure_policy == "retry"
            else None
        )
        self._consumer = KeyrangeConsumer(
            *config.topics,
            bootstrap_servers=config.bootstrap_servers,
            coordinator_url=config.coordinator_url,
            group_id=config.group_id,
            token=config.token,
            assignor=config.assignor,
            session_timeout_ms=config.session_timeout_ms,
            coordinator_start_timeout_ms=config.coordinator_start_timeout_ms,
            auto_commit_interval_ms=config.commit_interval_ms,
            revoke_timeout_s=config.drain_timeout_s,
            **{**security, **config.consumer_options},
        )
        self._calls = Calls(config.threads, config.processes, self._consumer.gate)
        self.runtime: WorkerRuntime | None = None
        self._graceful = GracefulStop("worker", config.group_id)

    @property
    def consumer(self) -> KeyrangeConsumer:
        return self._consumer

    @property
    def stats(self) -> Stats:
        return Stats() if self.runtime is None else self.runtime.stats

    @property
    def process_wait_s(self) -> float:
        """Seconds the ``processes`` waited for records, summed over them (0 without)."""
        return self._calls.process_wait_s

    def stop(self) -> None:
        """Ask the worker to shut down (finish, commit, leave); ``run`` returns after."""
        self._graceful.request()

    async def run(self, *, handle_signals: bool = False) -> None:
        metrics = (
            None
            if self.config.metrics_port is None
            else MetricsServer(
                self.config.metrics_port,
                lambda: worker_families(
                    self.runtime, self._consumer.stuck_calls(), self.config.max_buffered_bytes
                ),
                asyncio.get_running_loop(),
                extra=METRICS_EXTRA,
                host=self.config.metrics_host,
            )
        )
        try:
            with self._graceful.signals_handled(handle_signals):
                async with self._consumer:
                    # The runtime finishes within ``drain_timeout_s`` before the commit.
                    await self._graceful.drive(
                        self._consumer,
                        self._make_runtime,
                        stopping="finishing records in processing, then committing",
                    )
        finally:
            if self.runtime is not None:
                self._consumer.hooks.unregister(self.runtime)
            if metrics is not None:
                metrics.close()
            self._calls.close()
            if self._dead_letters is not None:
                await self._dead_letters.stop()

    def _make_runtime(self, source: WorkerSource) -> WorkerRuntime:
        handler_process = (
            None if self._handler is None else self._calls.handler_process(self._handler)
        )
        runtime = WorkerRuntime(
            source,
            self.config,
            self._calls,
            task_factory=self._task,
            handler_process=handler_process,
            partitioner=self._partitioner,
            dead_letters=self._dead_letters,
            tracer=record_tracer("worker", self.config.group_id, lambda: self._consumer.member_id),
        )
        self.runtime = runtime
        self._consumer.hooks.register(runtime)
        # What was granted before the runtime existed, as if granted now.
        runtime.assigned(self._consumer.assignment())
        return runtime
