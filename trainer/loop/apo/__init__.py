"""APO (automatic prompt optimisation) from traces: ``agl-bridge apo`` (see docs/prompts.md)."""
