"""Adapters: Azure SDK and HTTP implementations of the service ports."""
