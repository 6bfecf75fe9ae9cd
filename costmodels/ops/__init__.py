"""Op models: ``predict(op) -> seconds`` for every op kind (GEMM, attention, decode,
block-sparse attention, memory-bound ops, collectives, sparse GEMMs, energy), analytical
and with learned corrections, and the shipped calibration profiles that parameterise them."""
