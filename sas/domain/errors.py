"""Domain errors. Adapters translate SDK exceptions into these."""

from __future__ import annotations


class SasError(Exception):
    """Base of every error raised on purpose by sas."""


class ConcurrencyConflict(SasError):
    """A conditional write lost to a concurrent writer (stale ETag)."""


class AlreadyExists(SasError):
    """An insert found the entity already there."""


class NotFound(SasError):
    """The entity or queue does not exist."""


class IllegalTransition(SasError):
    """The requested state change is not allowed from the current state."""


class StaleReply(IllegalTransition):
    """A reply answers an attempt or step that is no longer current (fencing)."""


class DefinitionMissing(SasError):
    """The workflow version an order was bound to is not deployed here (or differs from the one
    it began with): the order is never run on another definition. ``reason`` is safe to show."""

    def __init__(self, reason: str, *, newer: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.newer = newer
        """Newer than any version of the workflow deployed here: a host mid-deploy."""


class InvalidMessage(SasError):
    """A message failed validation; ``reason`` is safe to log and to show an operator."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ConfigurationError(SasError):
    """A setting is missing or malformed; the message names the key."""


class TransientRemoteError(SasError):
    """The remote service failed in a way that may clear on retry.

    ``order_scoped``: the fault is the order's own (its data: an address that bounced), not
    the remote's. It is retried all the same, but the circuit breaker counts the call as the
    remote answering, so one order's faults never open it for the others."""

    def __init__(
        self, reason: str, retry_after: float | None = None, *, order_scoped: bool = False
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.order_scoped = order_scoped


class PermanentRemoteError(SasError):
    """The remote service refused the work; retrying will not help."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
