"""Azure Functions entry point: composes the app from sas's entry points, nothing else."""

import azure.functions as func

from sas.entrypoints.http_function import blueprint as http_functions
from sas.entrypoints.queues import blueprint as queue_functions
from sas.entrypoints.timer import blueprint as timer_functions

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
app.register_functions(http_functions)
app.register_functions(queue_functions)
app.register_functions(timer_functions)
