"""The operator CLI, installed as the `sas` console script; never deployed with the app."""
