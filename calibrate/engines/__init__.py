"""Real serving engines' own host-side code measured without a GPU: their schedulers
driven by fake model executors (``vllm_scheduler_probe``). Runners: they run in the
engine's own virtualenv and import nothing of simcli, pydantic-dependent project code
included (tests/calibrate/test_vllm_scheduler_data.py checks it)."""
