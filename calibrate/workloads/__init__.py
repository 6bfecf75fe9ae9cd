"""Derivations of built-in workload tables (run offline; run-time code reads the results)."""
