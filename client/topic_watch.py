"""A warning while a subscribed topic does not exist.

The coordinator assigns a member nothing of a topic Kafka does not know, so a worker started on
a misspelt or not yet created topic would wait in silence. This watch names the missing topics
at start and again every ``interval_s`` while they stay missing, and says when they appear. It
reads Kafka's metadata for all topics, which creates none: creating topics is left to the user
(``keyrange topic create``), never done behind their back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

logger = logging.getLogger(__name__)

WARN_INTERVAL_S = 30.0


async def watch_missing_topics(
    topics: Sequence[str],
    existing_topics: Callable[[], Awaitable[set[str]]],
    *,
    interval_s: float = WARN_INTERVAL_S,
) -> None:
    """Return once every topic in ``topics`` exists; until then warn every ``interval_s``."""
    warned: set[str] = set()
    while True:
        try:
            missing = sorted(set(topics) - await existing_topics())
        except Exception as error:  # the broker is down: its own warnings say so
            logger.debug("could not read the topics' metadata", extra={"error": repr(error)})
        else:
            appeared = sorted(warned - set(missing))
            if appeared:
                logger.info("subscribed topics exist now", extra={"topics": appeared})
            if not missing:
                return
            logger.warning(
                f"subscribed topics do not exist: {', '.join(missing)}; nothing of them is "
                "assigned until they are created (keyrange topic create NAME --partitions N)",
                extra={"topics": missing},
            )
            warned = set(missing)
        await asyncio.sleep(interval_s)
