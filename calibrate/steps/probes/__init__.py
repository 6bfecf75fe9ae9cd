"""One-off GPU probes behind constants of costmodels/steps/serving.py (see each docstring)."""
