"""Queue-triggered roles: submit, schedule, on_reply and one agent per remote service."""

# No `from __future__ import annotations` here: the Functions worker reads the parameter
# annotations at index time and needs the real message class of the chosen transport.

from typing import TYPE_CHECKING

import azure.functions as func

from sas import bootstrap, settings
from sas.domain.messages import OrderSubmitted, ScheduleRequest, StepReply, StepRequest
from sas.domain.workflow import AGENTS
from sas.entrypoints.inbound import handle
from sas.entrypoints.triggers import TRANSPORT_IN_USE, queue_trigger

if TYPE_CHECKING:
    QueueMessage = func.QueueMessage | func.ServiceBusMessage
else:
    QueueMessage = func.ServiceBusMessage if TRANSPORT_IN_USE == "servicebus" else func.QueueMessage

blueprint = func.Blueprint()  # type: ignore[no-untyped-call]


@blueprint.function_name("submit")
@queue_trigger(blueprint, settings.QUEUE_ORDERS)
def submit(msg: QueueMessage) -> None:
    handle(
        msg,
        function="submit",
        queue_setting=settings.QUEUE_ORDERS,
        model=OrderSubmitted,
        handler=lambda message: bootstrap.submission().submit(message),
    )


@blueprint.function_name("schedule")
@queue_trigger(blueprint, settings.QUEUE_SCHEDULER)
def schedule(msg: QueueMessage) -> None:
    handle(
        msg,
        function="schedule",
        queue_setting=settings.QUEUE_SCHEDULER,
        model=ScheduleRequest,
        handler=lambda message: bootstrap.scheduler().schedule(message),
    )


@blueprint.function_name("on_reply")
@queue_trigger(blueprint, settings.QUEUE_REPLIES)
def on_reply(msg: QueueMessage) -> None:
    handle(
        msg,
        function="on_reply",
        queue_setting=settings.QUEUE_REPLIES,
        model=StepReply,
        handler=lambda message: bootstrap.scheduler().on_reply(message),
    )


def _register_agent(agent: str) -> None:
    queue_setting = settings.agent_queue_setting(agent)
    name = f"agent_{agent}"

    def run_agent(msg: QueueMessage) -> None:
        handle(
            msg,
            function=name,
            queue_setting=queue_setting,
            model=StepRequest,
            handler=lambda message: bootstrap.agent(agent).handle(message),
        )

    run_agent.__name__ = run_agent.__qualname__ = name
    blueprint.function_name(name)(queue_trigger(blueprint, queue_setting)(run_agent))


for _agent in AGENTS:
    _register_agent(_agent)
