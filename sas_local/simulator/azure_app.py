"""The simulator as a function app of its own in Azure, for a demo of the order workflow there.

Deployed only with `SAS_DEPLOY_SIMULATOR=true` (azure.yaml's `simulator` service, packaged by
`bundle.py`). It stands in for a third party's services, so it is open like one: anonymous
HTTP, with the routes the local simulator has, for any service name (the deployment points at
it the services given no URL). Its faults are fixed at start by the
SAS_SIMULATOR_FAULTS app setting (a `FaultConfig` as JSON; empty: none), never by a request.
Its ledger lives in memory: one instance (the infra caps it at one), empty again after the app
was idle (Flex Consumption scales it to zero) or restarted, with its outage window restarted.
"""

from __future__ import annotations

import os

import azure.functions as func

from sas_local.simulator.app import create_app
from sas_local.simulator.faults import FaultConfig

FAULTS_SETTING = "SAS_SIMULATOR_FAULTS"


def faults_from_settings() -> FaultConfig:
    """The faults the app setting names; ValueError (the app does not start) if invalid."""
    raw = os.environ.get(FAULTS_SETTING, "").strip()
    return FaultConfig.model_validate_json(raw) if raw else FaultConfig()


app = func.AsgiFunctionApp(
    app=create_app(
        faults_from_settings(),
        faults_fixed=f"faults are set by the {FAULTS_SETTING} app setting here",
        docs=False,
    ),
    http_auth_level=func.AuthLevel.ANONYMOUS,
)
