"""The Supervisor's timer: one sweep per tick of ``SAS_SUPERVISOR_SCHEDULE`` (NCRONTAB, UTC)."""

import logging

import azure.functions as func

from sas import bootstrap, settings
from sas.entrypoints.invocation import attributed
from sas.services import supervisor

log = logging.getLogger(__name__)

blueprint = func.Blueprint()  # type: ignore[no-untyped-call]

SUPERVISOR_PARALLELISM = 8
"""Due orders a sweep examines at once: each costs a read or two, mostly waiting on the
network, so a few threads keep a sweep over a thousand in-flight orders inside one period."""


@blueprint.function_name("supervise")
@blueprint.timer_trigger(
    schedule=f"%{settings.SUPERVISOR_SCHEDULE}%", arg_name="timer", run_on_startup=False
)
def supervise(timer: func.TimerRequest, context: func.Context) -> None:
    if timer.past_due:
        # Harmless: a sweep is idempotent and covers everything a missed tick would have.
        log.info("sas.supervisor_tick_past_due")
    with attributed(context.thread_local_storage, context.invocation_id):  # its pool's too
        try:
            supervisor.sweep(
                bootstrap.context(),
                parallelism=SUPERVISOR_PARALLELISM,
                budgets=bootstrap.budget_store(),
            )
        finally:
            bootstrap.gauges().maybe_sample()  # at most once a minute, only if metrics export
