"""The Azure Functions face of sas: blueprints whose bodies decode, call sas, translate."""
