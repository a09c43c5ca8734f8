"""Azure Functions entry point: composes the app from sas's blueprints, nothing else."""

import azure.functions as func

from sas.api import api
from sas.functions.queues import blueprint as queue_functions

app = func.AsgiFunctionApp(app=api, http_auth_level=func.AuthLevel.FUNCTION)
app.register_functions(queue_functions)
