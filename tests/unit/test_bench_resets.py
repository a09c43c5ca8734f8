"""The benchmark's set-up writes survive an answer lost to a reset connection (bench/resets.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from azure.core.exceptions import ResourceExistsError, ServiceResponseError

from sas_local.bench.resets import TRIES, retried

pytestmark = pytest.mark.unit


def calls(*outcomes: object) -> tuple[Callable[[], object], list[int]]:
    """A call answering each outcome in turn (an exception is raised), and its count."""
    made: list[int] = []

    def call() -> object:
        made.append(1)
        outcome = outcomes[len(made) - 1]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return call, made


def lost() -> ServiceResponseError:
    return ServiceResponseError("('Connection aborted.', ConnectionResetError(104))")


def test_a_lost_answer_is_tried_again_and_the_answer_returned() -> None:
    call, made = calls(lost(), "etag-2")

    assert retried(call) == "etag-2"
    assert len(made) == 2


def test_a_lost_answer_every_time_is_raised_after_the_last_try() -> None:
    call, made = calls(*(lost() for _ in range(TRIES)))

    with pytest.raises(ServiceResponseError):
        retried(call)
    assert len(made) == TRIES


def test_landed_on_a_later_try_means_the_lost_first_try_was_applied() -> None:
    call, made = calls(lost(), ResourceExistsError("exists"))

    assert retried(call, landed=(ResourceExistsError,)) is None
    assert len(made) == 2


def test_landed_on_the_first_try_is_a_real_conflict_and_raised() -> None:
    call, made = calls(ResourceExistsError("exists"))

    with pytest.raises(ResourceExistsError):
        retried(call, landed=(ResourceExistsError,))
    assert len(made) == 1


def test_other_errors_are_not_tried_again() -> None:
    call, made = calls(ValueError("bad"))

    with pytest.raises(ValueError, match="bad"):
        retried(call)
    assert len(made) == 1
