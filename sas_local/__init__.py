"""Local tooling for sas, never deployed: dev host, Azurite launcher, provisioning, simulator,
demo. The deployed package is `function_app.py` + `sas/` only (see `.funcignore`)."""
