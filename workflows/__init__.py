"""The application's workflows: sas runs what ``REGISTRY`` declares (sas/declared.py)."""

from sas.domain.workflow import Registry
from workflows.order import ORDER_WORKFLOW
from workflows.workspace import CLOUD, MAILER, WORKSPACE_WORKFLOW

REGISTRY = Registry(workflows=(ORDER_WORKFLOW, WORKSPACE_WORKFLOW), python_agents=(CLOUD, MAILER))
