"""The application's declared workflows: the ``REGISTRY`` of the module named by
``SAS_WORKFLOWS_MODULE`` (default ``workflows``, the package deployed beside function_app.py).

Imported on first use, once per process: the queue functions, settings and every handler's
context derive from it. Importing it does no I/O.
"""

from __future__ import annotations

import importlib
import os
from functools import cache

from sas.domain.errors import ConfigurationError
from sas.domain.workflow import Registry

WORKFLOWS_MODULE = "SAS_WORKFLOWS_MODULE"
DEFAULT_WORKFLOWS_MODULE = "workflows"


@cache
def registry() -> Registry:
    name = os.environ.get(WORKFLOWS_MODULE) or DEFAULT_WORKFLOWS_MODULE
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name.split(".")[0] and exc.name != name:
            raise
        raise ConfigurationError(
            f"{WORKFLOWS_MODULE}: no module {name!r} to declare workflows"
        ) from None
    found = getattr(module, "REGISTRY", None)
    if not isinstance(found, Registry):
        raise ConfigurationError(f"{name}.REGISTRY must be a sas Registry of the app's workflows")
    if problems := found.undeployable():
        raise ConfigurationError(f"{name}.REGISTRY: " + "; ".join(problems))
    return found
