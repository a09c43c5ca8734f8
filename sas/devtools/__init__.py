"""Local tooling: Azurite launcher, process helpers. Not used by the deployed app."""
