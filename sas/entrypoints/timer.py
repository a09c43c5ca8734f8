"""The Supervisor's timer: one sweep per tick of ``SAS_SUPERVISOR_SCHEDULE`` (NCRONTAB, UTC)."""

import logging

import azure.functions as func

from sas import bootstrap, settings

log = logging.getLogger(__name__)

blueprint = func.Blueprint()  # type: ignore[no-untyped-call]


@blueprint.function_name("supervise")
@blueprint.timer_trigger(
    schedule=f"%{settings.SUPERVISOR_SCHEDULE}%", arg_name="timer", run_on_startup=False
)
def supervise(timer: func.TimerRequest) -> None:
    if timer.past_due:
        # Harmless: a sweep is idempotent and covers everything a missed tick would have.
        log.info("sas.supervisor_tick_past_due")
    bootstrap.supervisor().sweep()
