"""Where messages go, and the fire-and-forget notifications shared by the services."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sas.domain.errors import NotFound
from sas.domain.messages import OperatorAlert, StatusEvent, StatusKind
from sas.services.ports import Transport

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Routes:
    orders: str
    scheduler: str
    replies: str
    alerts: str
    agents: Mapping[str, str]

    def agent(self, name: str) -> str:
        return self.agents[name]


class Notifier:
    """Status events to the submitter and alerts to operators.

    A status event is best effort: a missing or broken reply-to queue belongs to the
    submitter and must never fail or stall the order itself.
    """

    def __init__(self, transport: Transport, routes: Routes) -> None:
        self._transport = transport
        self._routes = routes

    def status(
        self,
        reply_to: str | None,
        order_id: str,
        status: StatusKind,
        at: datetime,
        *,
        step: str | None = None,
        detail: str | None = None,
    ) -> None:
        if reply_to is None:
            return
        event = StatusEvent(order_id=order_id, status=status, at=at, step=step, detail=detail)
        try:
            self._transport.send(
                reply_to,
                event,
                message_id=f"{order_id}:status:{status}:{step or '-'}:{at.timestamp():.6f}",
                correlation_id=order_id,
            )
        except NotFound:
            log.warning(
                "sas.status_queue_missing",
                extra={"order_id": order_id, "queue": reply_to, "status": status},
            )
        except (
            Exception
        ):  # the submitter's queue is full, disabled, or flaky: not our order's fault
            log.warning(
                "sas.status_send_failed",
                exc_info=True,
                extra={"order_id": order_id, "queue": reply_to, "status": status},
            )

    def alert(self, order_id: str, reason: str, at: datetime, *, message_id: str) -> None:
        """One operator alert: a message on the alerts queue and an ERROR log event."""
        log.error(
            "sas.operator_alert order=%s reason=%s",
            order_id,
            reason,
            extra={"order_id": order_id, "reason": reason},
        )
        self._transport.send(
            self._routes.alerts,
            OperatorAlert(order_id=order_id, reason=reason[:1000], at=at),
            message_id=message_id,
            correlation_id=order_id,
        )
