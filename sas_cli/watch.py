"""`sas watch`: counts by state and the most recent failures, refreshed in place."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from sas.domain.model import OrderState, ProcessState
from sas.services.operator import Operator, OrderQuery
from sas_cli import views

FAILED_STATES = (ProcessState.ERROR, ProcessState.COMPENSATED)


@dataclass(frozen=True)
class Snapshot:
    at: datetime
    counts: dict[ProcessState, int]
    failures: list[OrderState]

    def document(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "counts": {state.value: self.counts.get(state, 0) for state in ProcessState},
            "failures": [views.state_document(state) for state in self.failures],
        }

    def render(self, heading: str) -> RenderableType:
        return Group(
            Text(f"{heading}, at {views.at(self.at)}", style="bold"),
            views.counts_table(self.counts),
            views.failures_table(self.failures),
        )


def snapshot(operator: Operator, now: datetime, failures: int) -> Snapshot:
    found = [
        state
        for failed in FAILED_STATES
        for state in operator.find(OrderQuery(state=failed, limit=failures))
    ]
    found.sort(key=lambda state: (state.updated_at, state.order_id), reverse=True)
    return Snapshot(now, operator.counts(), found[:failures])


def watch(
    operator: Operator,
    clock: Callable[[], datetime],
    console: Console,
    *,
    interval: float,
    iterations: int | None,
    failures: int,
    as_json: bool,
    heading: str,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Until interrupted, or ``iterations`` refreshes. With ``as_json``: one JSON document a
    line per refresh, for scripts, instead of the live view."""
    if as_json:
        done = 0
        while (iterations is None or done < iterations) and not _reader_gone():
            if done:
                sleep(interval)
            print(json.dumps(snapshot(operator, clock(), failures).document()), flush=True)
            done += 1
        return
    first = snapshot(operator, clock(), failures)
    with Live(first.render(heading), console=console, auto_refresh=False) as live:
        done = 1
        while (iterations is None or done < iterations) and not _reader_gone():
            sleep(interval)
            live.update(snapshot(operator, clock(), failures).render(heading), refresh=True)
            done += 1


def _reader_gone() -> bool:
    """Nobody reads the output any more (sas_cli.commands.ReaderSafe): stop refreshing it."""
    return bool(getattr(sys.stdout, "gone", False))
