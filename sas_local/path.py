"""`python -m sas_local.path`: the files of ``sas/`` one step's life runs through.

Runs function_app.py's queue functions in this process against Azurite and the simulator, and
follows one order from its trigger through the submission, its first step's dispatch, the
agent's call and reply, to the reply's transition and the next step's dispatch, recording
every ``sas/`` file whose code runs (a profile hook on every thread). An order goes through
first so that what runs once per process (settings, clients) is not counted.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from sas import settings as settings_module
from sas_local.azurite import Azurite, free_port
from sas_local.processes import REPO_ROOT, start_process
from sas_local.provision import provision
from sas_local.stack import app_env, simulator_args

SAS = REPO_ROOT / "sas"


@dataclass(frozen=True)
class StepLife:
    files: dict[str, int]
    """Each ``sas/`` file that ran, by its path from the repository root: its lines."""
    function_lines: dict[str, int]
    """Each of those files: the lines of the functions in it that ran (first line to last)."""

    @property
    def lines(self) -> int:
        return sum(self.files.values())


def order_body(order_id: str) -> str:
    document = {
        "type": "OrderSubmitted",
        "order_id": order_id,
        "details": {
            "customer_id": "c1",
            "currency": "EUR",
            "address": "1 Path Street",
            "lines": [{"sku": "s1", "quantity": 1, "unit_price_cents": 100}],
        },
    }
    return base64.b64encode(json.dumps(document).encode()).decode()


@contextmanager
def recording() -> Iterator[set[CodeType]]:
    seen: set[CodeType] = set()
    root = str(SAS) + os.sep

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(root):
            seen.add(frame.f_code)

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        yield seen
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def measure() -> StepLife:
    with Azurite.start() as azurite:
        port = free_port()
        simulator = start_process(simulator_args(port, settings_module.HTTP_AGENTS))
        try:
            url = f"http://127.0.0.1:{port}"
            simulator.wait_for_http(f"{url}/health")
            env = app_env(azurite.connection_string, url)
            provision(settings_module.load(env))
            os.environ.update(env)
            return _follow(azurite.connection_string, _functions())
        finally:
            simulator.stop()


def _functions() -> dict[str, Callable[[Any], None]]:
    """The app's queue functions by the queue their trigger names."""
    spec = importlib.util.spec_from_file_location("function_app", REPO_ROOT / "function_app.py")
    assert spec is not None and spec.loader is not None  # noqa: S101
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = {}
    for function in module.app.get_functions():
        trigger = function.get_trigger()
        queue = getattr(trigger, "queue_name", None)
        if queue is not None:  # a literal name, or a %setting% (older commits)
            name = os.environ[queue.strip("%")] if queue.startswith("%") else queue
            found[name] = function.get_user_function()
    return found


def _follow(connection_string: str, functions: dict[str, Callable[[Any], None]]) -> StepLife:
    from azure.functions.queue import QueueMessage
    from azure.storage.queue import QueueClient

    def deliver(queue: str) -> None:
        client = QueueClient.from_connection_string(connection_string, queue)
        (message,) = client.receive_messages(max_messages=1)
        body = base64.b64decode(message.content)
        functions[queue](QueueMessage(id=message.id, body=body, dequeue_count=1))  # type: ignore[no-untyped-call]
        client.delete_message(message)

    orders = QueueClient.from_connection_string(connection_string, "sas-orders")
    life = ("sas-orders", "sas-agent-inventory", "sas-replies")
    for order_id in ("warm-up", "traced"):
        orders.send_message(order_body(order_id))
        if order_id == "traced":
            with recording() as seen:
                for queue in life:
                    deliver(queue)
        else:
            for queue in life:
                deliver(queue)
        QueueClient.from_connection_string(connection_string, "sas-agent-payment").clear_messages()
    spans: dict[str, set[int]] = {}
    for code in seen:
        last = max((line for _, _, line in code.co_lines() if line is not None), default=0)
        lines = range(code.co_firstlineno, max(last, code.co_firstlineno) + 1)
        spans.setdefault(code.co_filename, set()).update(lines)
    return StepLife(
        {
            str(Path(f).relative_to(REPO_ROOT)): len(Path(f).read_text().splitlines())
            for f in sorted(spans)
        },
        {str(Path(f).relative_to(REPO_ROOT)): len(spans[f]) for f in sorted(spans)},
    )


def main() -> None:
    life = measure()
    print(f"{'file':>5} {'ran':>5}")
    for path, lines in life.files.items():
        print(f"{lines:5d} {life.function_lines[path]:5d} {path}")
    ran = sum(life.function_lines.values())
    files = len(life.files)
    print(f"{life.lines:5d} {ran:5d} lines in {files} files of sas/ (whole files; functions run)")


if __name__ == "__main__":
    main()
