"""Chaos campaigns: the whole local system under seeded faults, judged by an independent
checker (docs/reliability.md). ``python -m sas_local.chaos --orders N --seed S``."""
