"""simcli: the simulator (training, serving, sparsity), reports and the CLI."""

__version__ = "0.1.0"
