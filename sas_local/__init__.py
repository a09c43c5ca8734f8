"""Local tooling for sas: dev host, Azurite launcher, provisioning, simulator, demo. The app's
package is `function_app.py` + `sas/` only (see `.funcignore`); the simulator alone can be
deployed, as a function app of its own, for a demo (`simulator/azure_app.py`)."""
