"""Where messages go: the queue names a service sends to, resolved from settings once.

Every queue the app consumes has a lane per priority (sas/domain/wire.py, ``Priority``): the
attributes name the normal lanes, ``lanes`` maps each of them to its lane per priority. A
queue without lanes (a test's routes, say) is its own lane for every priority.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sas.domain.wire import DEFAULT_PRIORITY, PRIORITIES, Priority


@dataclass(frozen=True)
class Routes:
    orders: str
    scheduler: str
    replies: str
    alerts: str
    agents: Mapping[str, str]
    lanes: Mapping[str, Mapping[Priority, str]] = field(default_factory=dict)
    """Lane per priority of each consumed queue, keyed by the queue's normal lane."""

    def lane(self, queue: str, priority: Priority = DEFAULT_PRIORITY) -> str:
        return self.lanes.get(queue, {}).get(priority, queue)

    def agent(self, name: str, priority: Priority = DEFAULT_PRIORITY) -> str:
        return self.lane(self.agents[name], priority)

    def all_lanes(self, queue: str) -> tuple[str, ...]:
        """``queue``'s lanes, highest priority first, without repeats."""
        return tuple(dict.fromkeys(self.lane(queue, p) for p in PRIORITIES))

    @property
    def consumed(self) -> tuple[str, ...]:
        """Every queue the app is triggered by, every lane of it."""
        return self.lanes_for(PRIORITIES)

    def lanes_for(self, priorities: tuple[Priority, ...]) -> tuple[str, ...]:
        """The lanes of ``priorities`` of every queue the app is triggered by."""
        bases = (self.orders, self.scheduler, self.replies, *self.agents.values())
        lanes = (self.lane(base, p) for base in bases for p in priorities)
        return tuple(dict.fromkeys(lanes))
