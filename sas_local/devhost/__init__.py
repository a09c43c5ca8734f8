"""Local dev host: runs ``function_app.py`` against Azurite the way the Functions host would.

Core Tools cannot run here, so ``python -m sas_local.devhost`` loads the v2-model app, indexes its
functions (queue, timer and HTTP triggers) and drives them itself: queue triggers with the
host's lease, retry and poison-queue semantics, NCRONTAB timers and HTTP through uvicorn.
Development tooling only; the deployed app never imports this package.
"""
