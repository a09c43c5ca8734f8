"""Parked messages, for an operator: bad input the app refused (kept in its table) and messages
the Functions host gave up on (poison or dead-letter queues, sas/domain/parked.py): listed,
found by filter, replayed or discarded one at a time or every one a filter matches. The HTTP
API, the dashboard and the `sas` CLI all go through here."""

from __future__ import annotations

import builtins
import logging
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial

from sas.domain.errors import ConfigurationError, IllegalTransition, NotFound
from sas.domain.messages import MAX_MESSAGE_BYTES
from sas.domain.model import AuditEntry
from sas.domain.parked import (
    ParkedBy,
    ParkedMessage,
    consumed_queues,
    more_unlisted,
    oldest_first,
    parked_by,
    poison_queue,
)
from sas.services import audit
from sas.services.context import Context
from sas.services.operator import MAX_QUERY_LIMIT, outcome_of, unlisted
from sas.services.ports import PoisonStore

log = logging.getLogger(__name__)

NO_SUCH_PARKED = "no such parked message"


@dataclass(frozen=True)
class ParkedQuery:
    """Which parked messages to act on; None means any."""

    parked_by: ParkedBy | None = None
    queue: str | None = None
    """The queue it was meant for, exactly."""
    reason: str | None = None
    """Text its reason contains, in any case."""
    older_than: timedelta | None = None
    """Parked more than this long ago (one whose time is unknown never matches)."""
    limit: int = 100

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_QUERY_LIMIT:
            raise ValueError(f"limit must be 1..{MAX_QUERY_LIMIT}")
        if self.older_than is not None and self.older_than < timedelta(0):
            raise ValueError("older_than must not be negative")

    def matches(self, message: ParkedMessage, now: datetime) -> bool:
        age = message.age(now)
        return (
            (self.parked_by is None or message.parked_by == self.parked_by)
            and (self.queue is None or message.queue == self.queue)
            and (self.reason is None or self.reason.casefold() in message.reason.casefold())
            and (self.older_than is None or (age is not None and age > self.older_than))
        )


@dataclass(frozen=True)
class ParkedReport:
    """What a bulk replay or discard matched and, unless a dry run, what became of each."""

    dry_run: bool
    matched: list[ParkedMessage]
    total: int
    """How many parked messages match in all (of the first MAX_QUERY_LIMIT listed)."""
    outcomes: dict[str, str]
    """Per parked id: ``done``, or why not."""
    more_unlisted: bool = False
    """More may be parked than were listed (ParkedPage.more_unlisted): act again after."""
    unmatched: list[str] = field(default_factory=list)
    """Ids it was told to act on only (``only``) that the query no longer matches: nothing
    was done to them."""


@dataclass(frozen=True)
class ParkedPage:
    messages: list[ParkedMessage]
    total: int
    """How many of those listed match."""
    more_unlisted: bool
    """More may be parked than were listed: a Storage poison queue shows its first 32
    (sas.domain.parked.STORAGE_PEEK_MAX), the listing its first MAX_QUERY_LIMIT."""


class ParkedMessages:
    def __init__(self, ctx: Context, poison: PoisonStore | None = None) -> None:
        self._store = ctx.store
        self._clock = ctx.clock
        self._poison = poison
        routes = ctx.routes
        self._consumed = consumed_queues(
            orders=routes.orders,
            scheduler=routes.scheduler,
            replies=routes.replies,
            agents=routes.agents,
            lanes=routes.lanes,
        )

    def list(self, limit: int = 100) -> builtins.list[ParkedMessage]:
        """Every parked message, the app's and the host's, oldest first: at most ``limit`` in
        all (each store's oldest ``limit``, merged)."""
        app = [
            message
            if message.function is not None
            else replace(message, function=self._consumed.get(message.queue))
            for message in self._store.list_parked(limit)
        ]
        host = self._poison_store().list(limit)
        return oldest_first([*app, *host])[:limit]

    def age_seconds(self, message: ParkedMessage) -> float | None:
        """How long it has been parked, by the injected clock, never negative; None if unknown."""
        age = message.age(self._clock.now())
        return None if age is None else age.total_seconds()

    def replay(self, parked_id: str, *, actor: str) -> None:
        """Send a parked message back to the queue it was meant for, then remove it.

        Parked by the app (a rejected row key): its original body, as an application would
        send it; IllegalTransition if only part of the body was kept, the body is over what the
        app accepts, or the queue is not one the app consumes. A message that is still bad is
        simply parked again. Parked by the host (a ``p1.`` id): the very message, unchanged
        (the poison store's rules). NotFound if there is no such message (any more), the id is
        of neither kind, or the queue is gone."""
        by = parked_by(parked_id)
        queue: str | None
        if by == "app":
            queue = self._replay_app_parked(parked_id)
        elif by == "host":
            if not self._poison_store().replay(parked_id):
                raise NotFound(NO_SUCH_PARKED)
            queue = poison_queue(parked_id)
        else:
            raise NotFound(NO_SUCH_PARKED)
        audit.record(
            self._store,
            AuditEntry(self._clock.now(), actor, "parked_replay", parked_id, None, f"to {queue}"),
        )
        log.warning(
            "sas.parked_replayed parked_id=%s parked_by=%s queue=%s",
            parked_id,
            by,
            queue,
            extra={"parked_id": parked_id, "parked_by": by, "queue": queue, "actor": actor[:100]},
        )

    def discard(self, parked_id: str, *, actor: str) -> None:
        """Gone for good; NotFound if there is no such message (any more) or the id is of
        neither kind."""
        by = parked_by(parked_id)
        if by == "app":
            gone = self._store.drop_parked(parked_id)
        elif by == "host":
            gone = self._poison_store().discard(parked_id)
        else:
            gone = False
        if not gone:
            raise NotFound(NO_SUCH_PARKED)
        audit.record(
            self._store,
            AuditEntry(self._clock.now(), actor, "parked_discard", parked_id, None, f"by {by}"),
        )
        log.warning(
            "sas.parked_discarded parked_id=%s parked_by=%s",
            parked_id,
            by,
            extra={"parked_id": parked_id, "parked_by": by, "actor": actor[:100]},
        )

    def _replay_app_parked(self, parked_id: str) -> str:
        """Replay a message the app parked; the queue it went to."""
        parked = self._store.get_parked(parked_id)
        if parked is None:
            raise NotFound(NO_SUCH_PARKED)
        queue, body = parked.queue, parked.body
        if queue not in self._consumed:
            raise IllegalTransition(f"{queue} is not a queue the app consumes: nothing to replay")
        if parked.body_truncated:
            raise IllegalTransition("only the start of the body was kept: it cannot be replayed")
        if len(body) > MAX_MESSAGE_BYTES:
            raise IllegalTransition(
                f"the body is over {MAX_MESSAGE_BYTES} bytes: the app would only park it again"
            )
        # Send first, then drop: a crash in between leaves it parked, and a second replay sends
        # it again, which the app handles idempotently (on Service Bus the same message id even
        # lets duplicate detection drop it). Dropping first could lose it.
        self._poison_store().requeue(queue, body, message_id=parked_id)
        if not self._store.drop_parked(parked_id):
            log.warning(
                "sas.parked_drop_lost parked_id=%s queue=%s",
                parked_id,
                queue,
                extra={"parked_id": parked_id, "queue": queue},
            )
        return queue

    def _poison_store(self) -> PoisonStore:
        if self._poison is None:
            raise ConfigurationError("no poison store is wired to the parked messages")
        return self._poison

    def find(self, query: ParkedQuery) -> ParkedPage:
        """The first ``query.limit`` matching parked messages, oldest first, how many match
        among those listed (the first MAX_QUERY_LIMIT), and whether more may be unlisted."""
        now = self._clock.now()
        listed = self.list(MAX_QUERY_LIMIT)
        found = [m for m in listed if query.matches(m, now)]
        unlisted = len(listed) >= MAX_QUERY_LIMIT or more_unlisted(listed)
        return ParkedPage(found[: query.limit], len(found), unlisted)

    def settle_matching(
        self,
        query: ParkedQuery,
        *,
        replay: bool,
        actor: str,
        dry_run: bool = True,
        only: Collection[str] | None = None,
    ) -> ParkedReport:
        """Replay (``replay``) or discard every parked message the query matches (at most
        ``query.limit``, oldest first) and, given ``only`` (the ids a dry run showed), among
        those only these; a dry run only lists them. One that fails is reported and the
        others go on."""
        # Given ``only``, chosen among every match: a newer one must not push them out.
        page = self.find(query if only is None else replace(query, limit=MAX_QUERY_LIMIT))
        matched = page.messages
        unmatched: list[str] = []
        if only is not None:
            chosen = set(only)
            matched = [message for message in matched if message.id in chosen][: query.limit]
            unmatched = unlisted(only, {message.id for message in matched})
        outcomes: dict[str, str] = {}
        if not dry_run:
            act = self.replay if replay else self.discard
            verb = "replayed" if replay else "discarded"
            for message in matched:
                outcomes[message.id] = outcome_of(partial(act, message.id, actor=actor), verb)
        return ParkedReport(dry_run, matched, page.total, outcomes, page.more_unlisted, unmatched)
