"""Moving an order's in-flight marker on after the Scheduler writes its state, a batch at a time.

The Supervisor reads an order when its marker comes due (docs/architecture.md, "Recovery").
Transitions do not touch the marker, so under a backlog, when steps take about as long as their
budget, the marker comes due at a deadline the order has just moved past, and the sweep reads a
healthy order only to re-arm it: about two reads per order in a 1,000-order burst, a read
every budget for as long as the order waits. A Scheduler that writes a state whose marker is
due (or about to be) moves the marker itself to the new state's next look, in a transaction
with the other moves of the last second.

Why a move can never hide a deadline: it sets ``look_again_at(state, now)`` for a state this
process wrote at ``now``: no later than that state's own deadline, and no later than ``now`` +
the shortest budget, which no deadline set by a later transition can come before. So a move
may land late, out of order, after a newer move or a sweep's re-arm, or never: the marker is
never due later than a deadline it must catch, and a lost move costs the read it would have
saved. A move only changes ``DueAt`` of a marker that exists (a dropped marker stays dropped).

A move is sent only when the marker is due within ``lookahead`` by the state this write
replaced: when an order moves on well before its marker is due (a quiet system), moving the
marker would cost a request to save nothing (the order usually finishes before it is due).

A write that finishes an order (Processed or Compensated: states nothing leads out of) drops
its marker in the same transaction as the moves, where the Supervisor would read the order
once its marker came due and then delete the marker: two requests per order, one by one.
The drop is conditional on the ETag the submission's upsert gave the marker (kept in the
state, ``OrderState.marker_etag``), so it deletes only the marker as the submission wrote it:
one moved or re-armed since, touched by an operator, or written for a new order under the same
id after a purge fails its condition and stays for the Supervisor, which drops it as before.
Such a failure costs a request (the transaction is sent again without it), so a drop is sent
only while the marker is unlikely to have been moved or re-armed (``_drop_by``).

Later than that (in a backlog, orders finish after their marker came due and was moved or
re-armed), the write marks the marker finished instead, in the same transaction: a merge, with no
ETag, of the id the submission's touch wrote into the marker (``OrderState.marker_touch``,
random) and a due time in the past (the submission's: a mark that lands on another order's
marker, however late, makes it due no later than it was). The Supervisor drops a marker so
marked without reading the order, a hundred to a request, where it used to read each order and
then delete its marker alone. A marker counts as finished only while the touch id it carries is
the one the mark names (``LiveMarker.finished``): any touch since (a redelivered submission, an
operator, a new order under the id after a purge) writes another id or none, and such a marker
is read as before, so a mark, however late, never unindexes an order that may be live.
An Error keeps its marker unmarked: the Supervisor sees its alert sent."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

from sas.domain.clock import Clock
from sas.domain.model import OrderState, ProcessState, Settled
from sas.domain.transitions import look_again_at
from sas.domain.workflow import workflow_named

log = logging.getLogger(__name__)

_IN_TRANSIT = timedelta(seconds=1)
"""Allowed for a drop on its way to the store, beside a move or sweep that may overtake it."""

_FINAL = frozenset({ProcessState.PROCESSED, ProcessState.COMPENSATED})
"""Terminal states no transition leaves (an operator resubmits only an Error)."""


class LiveIndex(Protocol):
    def settle_live(
        self,
        moves: Sequence[tuple[str, datetime]],
        drops: Sequence[tuple[str, str]],
        finishes: Sequence[tuple[str, datetime, str]] = (),
    ) -> Settled: ...


class MarkerMoves:
    def __init__(
        self,
        index: LiveIndex,
        clock: Clock,
        *,
        lookahead: timedelta = timedelta(seconds=5),
        window: timedelta = timedelta(seconds=1),
        clock_skew: timedelta = timedelta(seconds=2),
    ) -> None:
        """``window``: moves and drops are sent at most this often (the ones waiting go
        together). ``clock_skew``: how far ahead a Supervisor's clock may run (a drop is not
        sent once a sweep may have re-armed the marker)."""
        self._index = index
        self._clock = clock
        self._lookahead = lookahead
        self._window = window
        self._drop_margin = max(lookahead, clock_skew) + _IN_TRANSIT
        self._lock = threading.Lock()
        self._waiting: dict[str, datetime] = {}
        self._drops: dict[str, tuple[str, datetime, tuple[datetime, str] | None]] = {}
        """By order id: the marker's ETag, until when a drop is worth sending, and its mark."""
        self._finishes: dict[str, tuple[datetime, str]] = {}
        """By order id: the finished order's mark: due at its submission, for its touch id."""
        self._sent_at: datetime | None = None

    def after_write(self, replaced: OrderState, written: OrderState, at: datetime) -> None:
        """The Scheduler wrote ``written`` over ``replaced`` at ``at`` (its transition time)."""
        order_id = written.order_id
        if written.is_terminal:
            etag, send_by = written.marker_etag, self._drop_by(written)
            mark = (
                None
                if written.marker_touch is None
                else (written.submitted_at, written.marker_touch)
            )
            with self._lock:
                # One operation per marker in a transaction: this write's replaces any other
                # (an earlier order's under the same id, held here while it was purged).
                self._waiting.pop(order_id, None)
                self._drops.pop(order_id, None)
                self._finishes.pop(order_id, None)
                if etag is None or send_by is None:
                    pass  # an Error keeps its marker; one touched since is the Supervisor's
                elif at < send_by:
                    self._drops[order_id] = (etag, send_by, mark)
                elif mark is not None:
                    self._finishes[order_id] = mark
        elif (
            look_again_at(
                replaced, now=replaced.updated_at, workflow=workflow_named(replaced.workflow)
            )
            <= at + self._lookahead
        ):
            due = look_again_at(written, now=at, workflow=workflow_named(written.workflow))
            with self._lock:
                self._waiting[order_id] = due  # a newer write's move replaces an older one
                self._drops.pop(order_id, None)  # one operation per marker in a transaction
                self._finishes.pop(order_id, None)
        self.send_waiting()  # any write sends what waits, once the window is over

    def _drop_by(self, written: OrderState) -> datetime | None:
        """Until when a drop of the finished order's marker is worth sending; None: never.

        A heuristic of cost: while the marker the submission wrote is unlikely to have been
        moved or re-armed. Its first due time is the submission's time + the workflow's
        shortest budget (no claim sets an earlier deadline); a move may change it (and its
        ETag) from ``lookahead`` before that, a sweep whose clock runs ahead from
        ``clock_skew`` before; and the drop needs a moment to land. The larger of the two
        leads, not their sum: a move decided on another Scheduler whose clock is ahead of this
        one's can still come first, and then the drop fails its condition, one request more
        with the Supervisor's read and delete still to come. Safety does not rest on this: the
        condition does."""
        if written.process_state not in _FINAL or written.marker_etag is None:
            return None
        first_due = written.submitted_at + workflow_named(written.workflow).shortest_budget
        return first_due - self._drop_margin

    def send_waiting(self) -> int:
        """Send the waiting moves, drops and finish marks, unless some were sent less than
        ``window`` ago. Returns how many markers moved, went or were marked. Never raises: a
        move that is not sent costs the Supervisor a read, a drop or mark its read and
        delete, nothing else."""
        now = self._clock.now()
        with self._lock:
            if not self._waiting and not self._drops and not self._finishes:
                return 0
            if self._sent_at is not None and now - self._sent_at < self._window:
                return 0
            moves, self._waiting = list(self._waiting.items()), {}
            drops: list[tuple[str, str]] = []
            for order_id, (etag, by, mark) in self._drops.items():
                if now < by:
                    drops.append((order_id, etag))
                elif mark is not None:  # waited past its time: the marker may have moved
                    self._finishes[order_id] = mark
            finishes = [(order_id, due, touch) for order_id, (due, touch) in self._finishes.items()]
            self._drops, self._finishes = {}, {}
            self._sent_at = now
        count = len(moves) + len(drops) + len(finishes)
        try:
            settled = self._index.settle_live(moves, drops, finishes)
        except Exception:
            log.warning("sas.marker_moves_failed", extra={"count": count}, exc_info=True)
            return 0
        log.info(
            "sas.markers_settled",
            extra={
                "count": count,
                "moved": settled.moved,
                "dropped": settled.dropped,
                "finished": settled.finished,
                "requests": settled.requests,
            },
        )
        return settled.moved + settled.dropped + settled.finished
