"""One-off GPU probes behind constants of simcli/serving/step.py (see each docstring)."""
