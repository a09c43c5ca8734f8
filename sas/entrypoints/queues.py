"""Queue-triggered roles: submit, schedule, on_reply and one agent per remote service.

Each role below is one plain function: decode the message (bad input is parked, see
``inbound.handle``), call the role's handler with this process's context. Every role is
registered once per priority lane (``submit``, ``submit_high``, ``submit_low``, ...), each
triggered by its own queue, so a lane's backlog never delays another lane's messages; the
priority that matters travels in the order's state and messages.
"""

# No `from __future__ import annotations` here: the Functions worker reads the parameter
# annotations at index time and needs the real message class of the chosen transport.

from collections.abc import Callable
from typing import TYPE_CHECKING

import azure.functions as func

from sas import bootstrap, settings
from sas.domain.messages import OrderSubmitted, ScheduleRequest, StepReply, StepRequest
from sas.domain.wire import PRIORITIES, lane_function_name, lane_setting
from sas.domain.workflow import AGENTS
from sas.entrypoints.inbound import handle
from sas.entrypoints.triggers import TRANSPORT_IN_USE, queue_trigger
from sas.services import agent, scheduler, submission

if TYPE_CHECKING:
    QueueMessage = func.QueueMessage | func.ServiceBusMessage
else:
    QueueMessage = func.ServiceBusMessage if TRANSPORT_IN_USE == "servicebus" else func.QueueMessage

blueprint = func.Blueprint()  # type: ignore[no-untyped-call]


def submit(msg: QueueMessage, function: str, queue_setting: str) -> None:
    """Submission: an application's order (sas/services/submission.py)."""
    handle(
        msg,
        function=function,
        queue_setting=queue_setting,
        model=OrderSubmitted,
        handler=_with_context(submission.submit),
    )


def schedule(msg: QueueMessage, function: str, queue_setting: str) -> None:
    """The Scheduler claims a Pending order (a retry, compensation, a resubmit)."""
    handle(
        msg,
        function=function,
        queue_setting=queue_setting,
        model=ScheduleRequest,
        handler=_with_context(scheduler.schedule),
    )


def on_reply(msg: QueueMessage, function: str, queue_setting: str) -> None:
    """The Scheduler applies an agent's reply and dispatches what follows."""
    handle(
        msg,
        function=function,
        queue_setting=queue_setting,
        model=StepReply,
        handler=_with_context(scheduler.on_reply),
    )


def run_step(name: str) -> Callable[[QueueMessage, str, str], None]:
    """The agent ``name``: one step request, one remote service (sas/services/agent.py)."""

    def run(msg: QueueMessage, function: str, queue_setting: str) -> None:
        def step(request: StepRequest) -> object:
            return agent.run_step(bootstrap.agent_context(), name, request)

        handle(msg, function=function, queue_setting=queue_setting, model=StepRequest, handler=step)

    return run


def _with_context(handler: Callable[..., object]) -> Callable[..., object]:
    return lambda message: handler(bootstrap.context(), message)


def _register(role: Callable[[QueueMessage, str, str], None], name: str, setting: str) -> None:
    """``role`` as one function per priority lane of the queue ``setting`` names."""
    for priority in PRIORITIES:
        function, lane = lane_function_name(name, priority), lane_setting(setting, priority)
        blueprint.function_name(function)(
            queue_trigger(blueprint, lane)(_lane(role, function, lane))
        )


def _lane(
    role: Callable[[QueueMessage, str, str], None], function: str, lane: str
) -> Callable[[QueueMessage], None]:
    # A function of its own per lane: the worker binds every parameter, so `msg` is the only one.
    def run(msg: QueueMessage) -> None:
        role(msg, function, lane)

    run.__name__ = run.__qualname__ = function
    return run


_register(submit, "submit", settings.QUEUE_ORDERS)
_register(schedule, "schedule", settings.QUEUE_SCHEDULER)
_register(on_reply, "on_reply", settings.QUEUE_REPLIES)
for _agent in AGENTS:
    _register(run_step(_agent), f"agent_{_agent}", settings.agent_queue_setting(_agent))
