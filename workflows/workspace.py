"""A workspace for a team: create it, configure it for its plan, tell its owner.

Its agents are the app's own Python functions. Each effect is a row of the ``workspaces`` table
(in the app's storage account), inserted once under its step's idempotency key with a digest of
the request: a retry, a duplicate delivery or a late second attempt finds the row and returns
what the first did; the key used again for another request (an order id submitted again after
a purge) is refused.
Nothing is undone automatically (``on_failure="error"``): a workspace that cannot be configured
or announced stops in Error, with an alert, for an operator to finish or remove.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any, Literal, Protocol

from azure.core.exceptions import ResourceExistsError
from pydantic import BaseModel, ConfigDict, StringConstraints

from sas.actions import ActionContext, PythonAgent, Refused, Transient, app_table
from sas.domain.messages import result_problem
from sas.domain.workflow import StepDefinition, Workflow
from workflows.order import BusinessId

TABLE = "workspaces"
SEATS = {"free": 3, "team": 50, "enterprise": 1000}


class WorkspaceRequest(BaseModel):
    """The workspace workflow's input."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, regex_engine="python-re")

    team: BusinessId
    owner: Annotated[
        str,
        StringConstraints(
            pattern=r"^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63}){1,8}\Z"
        ),
    ]
    plan: Literal["free", "team", "enterprise"]
    region: Literal["westeurope", "eastus", "australiaeast"]


class Effects(Protocol):
    def once(
        self, context: ActionContext, data: dict[str, Any], result: dict[str, Any]
    ) -> dict[str, Any]:
        """Apply the effect whose outcome is ``result`` unless this step's idempotency key
        already applied one; either way, the outcome that stands. ``Refused`` if the key
        already served other ``data`` (an order id used again after a purge)."""
        ...


def digest(data: dict[str, Any]) -> str:
    """What a request was, in a few bytes: a key used again must come with the same data."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


class TableEffects:
    """Each effect one row: PartitionKey the order, RowKey the idempotency key. Inserting it
    is the effect; a second insert conflicts and the first one's result is returned."""

    def __init__(self, table: str) -> None:
        self.table = table

    def once(
        self, context: ActionContext, data: dict[str, Any], result: dict[str, Any]
    ) -> dict[str, Any]:
        if problem := result_problem(result):  # never store what no reply can carry
            raise ValueError(f"result {problem}")
        client = app_table(self.table)
        row = {
            "PartitionKey": context.order_id,
            "RowKey": context.idempotency_key,
            "Agent": context.agent,
            "Action": context.action,
            "Request": digest(data),
            "Result": json.dumps(result),
        }
        try:
            client.create_entity(row)
        except ResourceExistsError:  # an earlier attempt, or this one's lost first answer
            stored = client.get_entity(context.order_id, context.idempotency_key)
            if stored.get("Request") != row["Request"]:
                raise Refused("this idempotency key was used for another request") from None
            found: dict[str, Any] = json.loads(stored["Result"])
            return found
        return result


EFFECTS: Effects = TableEffects(TABLE)
"""Where the actions apply their effects (a test may put an in-memory one here)."""


def _derived_id(prefix: str, context: ActionContext) -> str:
    """An id every attempt of the step derives alike: a retry names the same workspace."""
    return f"{prefix}-{hashlib.sha256(context.idempotency_key.encode()).hexdigest()[:16]}"


def create(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
    if context.time_left() < 1:
        raise Transient("too little time left to create a workspace")
    region, domain = data["region"], context.setting("WORKSPACE_DOMAIN")
    return EFFECTS.once(
        context,
        data,
        {
            "workspace_id": _derived_id("ws", context),
            "region": region,
            "url": f"https://{data['team'].lower()}.{region}.{domain}",
        },
    )


def configure(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
    if data["plan"] == "enterprise" and data["region"] == "australiaeast":
        raise Refused("no enterprise capacity in australiaeast")
    return EFFECTS.once(
        context,
        data,
        {"workspace_id": data["workspace_id"], "plan": data["plan"], "seats": SEATS[data["plan"]]},
    )


def notify(context: ActionContext, data: dict[str, Any]) -> dict[str, Any]:
    message = {"from": context.setting("MAIL_FROM"), "to": data["owner"]}
    return EFFECTS.once(context, data, {**message, "message_id": _derived_id("msg", context)})


def configuring(
    request: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """What configure is sent: the plan, and the workspace create made."""
    created = results["create"]
    return {
        "workspace_id": created["workspace_id"],
        "plan": request["plan"],
        "region": created["region"],
    }


def announcing(
    request: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """What notify is sent: who to tell, where the workspace is and how many seats it has."""
    return {
        "owner": request["owner"],
        "url": results["create"]["url"],
        "seats": results["configure"]["seats"],
    }


CLOUD = PythonAgent(
    "cloud",
    {"create": create, "configure": configure},
    tables=(TABLE,),
    settings={"WORKSPACE_DOMAIN": "example.net"},
)
MAILER = PythonAgent(
    "mailer",
    {"notify": notify},
    tables=(TABLE,),
    settings={"MAIL_FROM": "workspaces@example.net"},
)
_BUDGET = timedelta(seconds=15)

WORKSPACE_WORKFLOW = Workflow(
    name="workspace",
    steps=(
        StepDefinition("create", "cloud", "create", _BUDGET),
        StepDefinition("configure", "cloud", "configure", _BUDGET, input=configuring),
        StepDefinition("notify", "mailer", "notify", _BUDGET, input=announcing, max_failures=5),
    ),
    pickup_budget=timedelta(seconds=60),
    on_failure="error",
    input=WorkspaceRequest,
)
