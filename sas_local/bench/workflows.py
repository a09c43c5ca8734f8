"""What the request count runs (``SAS_WORKFLOWS_MODULE``): the app's order, and a one-step
workflow of its first step."""

from sas.domain.workflow import Registry, Workflow
from workflows.order import ORDER_WORKFLOW

SINGLE = Workflow(name="single", steps=ORDER_WORKFLOW.steps[:1])
REGISTRY = Registry(workflows=(ORDER_WORKFLOW, SINGLE))
