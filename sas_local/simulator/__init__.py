"""A simulated remote provider (inventory, payment, shipping) for local runs and tests.

`POST /{service}/{action}`, for a service it plays (`--services`; another is a 404 naming it),
applies an effect at most once per Idempotency-Key and keeps a ledger that tests and the demo
read back (`GET /ledger`). A repeated key returns the original response, marked
`Idempotent-Replayed: true`, and applies nothing. A payload carrying `original_action` +
`original_key` is an undo of that earlier do (see `books`). Faults — transient, permanent,
slow, an outage window — are injected per `faults.FaultConfig`, set by CLI flags or at runtime
with `PUT /faults`.

Run: `python -m sas_local.simulator --port 7081 [--transient-rate 0.1 ...]` (see `--help`); in
Azure, a function app of its own (`azure_app.py`, packaged by `bundle.py`).
"""

from sas_local.simulator.__main__ import main
from sas_local.simulator.app import create_app
from sas_local.simulator.faults import FaultConfig

__all__ = ["FaultConfig", "create_app", "main"]
