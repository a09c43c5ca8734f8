"""Where messages go: the queue names a service sends to, resolved from settings once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Routes:
    orders: str
    scheduler: str
    replies: str
    alerts: str
    agents: Mapping[str, str]

    def agent(self, name: str) -> str:
        return self.agents[name]
