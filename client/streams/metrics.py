"""What a streams application reports on its optional metrics port
(``client.metrics_server``): ``StreamsApp.metrics()`` per task, as Prometheus families
labelled by the task (``subtopology_partition[start-end]``) and, for restorations, the store;
and the input's byte budget (``StreamsApp.budget_figures()``), unlabelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client.metrics_server import Family

EXTRA = "streams"

_TASK_FIGURES = (
    ("records", "counter", "Input records processed by the task."),
    ("punctuations", "counter", "Punctuations the task fired."),
    ("buffered", "gauge", "Input records fetched for the task and not processed yet."),
    ("ready", "gauge", "1 once every store of the task is restored, 0 while restoring."),
)
_RESTORE_FIGURES = (
    ("read", "gauge", "Changelog records fetched by the restoration (every record, any key)."),
    ("restored", "gauge", "Changelog records of the task's key range written to the store."),
    ("fraction", "gauge", "Share of the changelog span read so far (1 when done)."),
    ("failures", "counter", "Attempts of the restoration that failed (each logged as ERROR)."),
)


_BUDGET_FIGURES = (
    ("buffered_bytes", "Bytes of input records taken from Kafka and not processed yet."),
    ("buffered_bytes_bound", "The bound of buffered bytes (max_buffered_bytes)."),
    ("paused_partitions", "Partitions whose fetching is paused for the byte budget."),
)


def streams_families(
    tasks: Mapping[str, Mapping[str, Any]], budget: Mapping[str, float] | None = None
) -> list[Family]:
    families = [
        Family(
            f"keyrange_streams_task_{name}",
            text,
            "counter" if kind == "counter" else "gauge",
            ("task",),
            [((task,), float(figures[name])) for task, figures in tasks.items()],
        )
        for name, kind, text in _TASK_FIGURES
    ]
    families.append(
        Family(
            "keyrange_streams_task_stream_time_lag_seconds",
            "Wall clock minus the task's stream time (absent before its first record).",
            labels=("task",),
            samples=[
                ((task,), figures["stream_time_lag_ms"] / 1000)
                for task, figures in tasks.items()
                if figures["stream_time_lag_ms"] is not None
            ],
        )
    )
    families.extend(
        Family(
            f"keyrange_streams_restore_{name}",
            text,
            "counter" if kind == "counter" else "gauge",
            labels=("task", "store"),
            samples=[
                ((task, restore["store"]), float(restore[name]))
                for task, figures in tasks.items()
                for restore in figures["restore"]
            ],
        )
        for name, kind, text in _RESTORE_FIGURES
    )
    families.extend(
        Family(f"keyrange_streams_{name}", text, samples=[((), float(budget[name]))])
        for name, text in _BUDGET_FIGURES
        if budget is not None
    )
    return families
