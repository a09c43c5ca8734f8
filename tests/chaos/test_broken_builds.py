"""Deliberately broken builds, run end to end as small campaigns: the checker must flag each.

The breakage is monkeypatched into the dev host workers only (``--broken``, applied by the
preloaded ``sas_local.chaos.inject``); the product's code on disk is untouched. ``make test``
runs the fence's, which proves the chain (injection, campaign, checker) end to end; the others
(marker ``broken_builds``, some six minutes of waiting for deadlines) run under ``make chaos``.
The checker's verdict on each kind of violation is proved from recorded evidence
(tests/chaos/test_checker.py), in every ``make test``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sas_local.chaos.campaign import Options, Profile, run_campaign

pytestmark = pytest.mark.chaos

QUIET = Profile(
    transient_rate=0.0,
    permanent_rate=0.0,
    undo_permanent_rate=0.0,
    slow_rate=0.0,
    duplicate_rate=0.0,
    delay_rate=0.0,
    submit_duplicate_rate=0.0,
    resubmit_share=0.0,
    runner_faults=False,
    deploy=False,
    min_storm=0.0,
)


def broken_campaign(
    tmp_path: Path,
    broken: str | tuple[str, ...],
    profile: Profile,
    orders: int = 30,
    drain: float = 60,
) -> dict[str, Any]:
    return run_campaign(
        Options(
            orders=orders,
            seed=17,
            broken=(broken,) if isinstance(broken, str) else broken,
            profile=profile,
            drain_timeout=drain,  # broken builds may never settle; the checker judges anyway
            log_dir=tmp_path / "logs",
            report=tmp_path / "report.json",
        )
    )


def test_a_fence_that_lets_every_reply_through_is_caught(tmp_path: Path) -> None:
    # Duplicated replies: the copy arrives after the order moved on, and is applied.
    profile = Profile(**{**QUIET.__dict__, "duplicate_rate": 0.3, "min_storm": 20.0})
    report = broken_campaign(tmp_path, "fence", profile)
    assert report["violations_by_kind"].get("stale_reply_applied", 0) > 0, report


@pytest.mark.broken_builds
def test_an_alert_lease_of_zero_is_caught(tmp_path: Path) -> None:
    # Many refused undos -> many Errors; the slow sender meets the sweeps, which re-claim.
    profile = Profile(**{**QUIET.__dict__, "permanent_rate": 0.6, "undo_permanent_rate": 1.0})
    report = broken_campaign(tmp_path, "alert_lease", profile)
    assert report["violations_by_kind"].get("error_alerts", 0) > 0, report


@pytest.mark.broken_builds
def test_an_idempotency_key_that_includes_the_attempt_is_caught(tmp_path: Path) -> None:
    # Slow answers apply the effect, then arrive after the deadline: the retry applies again.
    profile = Profile(**{**QUIET.__dict__, "slow_rate": 0.3})
    report = broken_campaign(tmp_path, "key_attempt", profile, orders=12)
    assert report["violations_by_kind"].get("effect_applied_twice", 0) > 0, report
    assert report["violations_by_kind"].get("unexpected_effect", 0) > 0, report  # its keys


# The other classes, several breaks to a campaign (each break picks its own share of the
# orders by id, so each class has orders that show it).


@pytest.mark.broken_builds
def test_lost_submissions_alerts_without_error_and_skipped_undos_are_caught(
    tmp_path: Path,
) -> None:
    profile = Profile(**{**QUIET.__dict__, "permanent_rate": 0.4})
    broken = ("lose_submission", "alert_on_processed", "skip_undo")
    report = broken_campaign(tmp_path, broken, profile, drain=45)
    found = report["violations_by_kind"]
    for kind in ("lost_order", "alert_without_error", "compensation_incomplete"):
        assert found.get(kind, 0) > 0, (kind, report)


@pytest.mark.broken_builds
def test_a_failure_count_past_the_threshold_and_a_missing_effect_are_caught(
    tmp_path: Path,
) -> None:
    # Slow answers arrive past the deadline: the step expires, again and again.
    profile = Profile(**{**QUIET.__dict__, "slow_rate": 0.6, "slow_seconds": 17.0})
    broken = ("failure_threshold", "skip_ship")
    report = broken_campaign(tmp_path, broken, profile, drain=60)
    found = report["violations_by_kind"]
    for kind in ("failure_count_exceeded", "processed_effect_missing"):
        assert found.get(kind, 0) > 0, (kind, report)


@pytest.mark.broken_builds
def test_stuck_orders_poisoned_messages_and_illegal_transitions_are_caught(
    tmp_path: Path,
) -> None:
    profile = Profile(**{**QUIET.__dict__, "slow_rate": 0.3})
    broken = ("no_expiry", "poison_reply", "skip_to_processed")
    report = broken_campaign(tmp_path, broken, profile, drain=40)
    found = report["violations_by_kind"]
    for kind in ("stuck_order", "poisoned_message", "illegal_transition"):
        assert found.get(kind, 0) > 0, (kind, report)


@pytest.mark.broken_builds
def test_a_host_that_ignores_the_order_s_version_is_caught(tmp_path: Path) -> None:
    # Slow answers keep v1 orders in flight until the deploy: new hosts read them as v2 (whose
    # hold is v1's reserve under another key), old hosts read v2 orders as v1.
    profile = Profile(**{**QUIET.__dict__, "slow_rate": 0.2, "deploy": True})
    report = broken_campaign(tmp_path, "ignore_version", profile, orders=150, drain=90)
    assert report["faults"]["deploy"] == 1, report
    found = report["violations_by_kind"]
    for kind in ("effect_applied_twice", "illegal_transition", "orphaned_effect"):
        assert found.get(kind, 0) > 0, (kind, report)
