"""Storage Queue SDK models made ready before threads share them.

azure-storage-queue's generated models work out their fields on the first instance of each
class (``Model.__new__``), unguarded: when several threads send or receive for the first time
in a process at once, one of them can read a class while another is still filling it in. The
send then fails with ``RuntimeError: dictionary changed size during iteration``, or its result
comes back half-decoded (``'Element' object has no attribute 'message_id'``) after the message
was queued. Seen in a benchmark's first concurrent sends; reproduced with 16 threads whose first
sends start together (about one process in ten).

:func:`prepare` creates one bare instance of every model class, on one thread, once per
process, before any client is handed out; afterwards the classes are only read. If the SDK's
layout is not the one recognised, it does nothing and logs one warning.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading

logger = logging.getLogger(__name__)

_MODELS_MODULE = "azure.storage.queue._generated.models"

_lock = threading.Lock()
_prepared = False


def prepare() -> bool:
    """Work out every queue model class now; False when the SDK's models were not found."""
    global _prepared
    with _lock:
        if _prepared:
            return True
        try:
            models = importlib.import_module(_MODELS_MODULE)
            base = importlib.import_module("azure.storage.queue._generated._utils.model_base").Model
        except (ImportError, AttributeError):
            logger.warning("sas.queue_models_not_prepared: the SDK's model layout is not known")
            return False
        try:
            for _, cls in inspect.getmembers(models, inspect.isclass):
                if issubclass(cls, base) and cls is not base:
                    cls.__new__(cls)  # fills in the class; the bare instance is dropped
        except Exception:  # a preparation, never a dependency: the SDK still works without it
            logger.warning("sas.queue_models_not_prepared", exc_info=True)
            return False
        _prepared = True
        return True
