"""What an application's Python agents are written with (see README, "Extend").

def charge(context: ActionContext, data: dict) -> dict:
    if context.time_left() < 1:
        raise Transient("too little time left")
    ...

PAYMENT = PythonAgent("payment", {"charge": charge, "refund": refund})
"""

from sas.domain.errors import PermanentRemoteError as Refused
from sas.domain.errors import TransientRemoteError as Transient
from sas.domain.workflow import PythonAgent
from sas.services.actions import ActionContext

__all__ = ["ActionContext", "PythonAgent", "Refused", "Transient"]
