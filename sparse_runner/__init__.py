"""sparse-runner: reproduce and extend sparse-attention papers from one Hydra-configured runner."""

__version__ = "0.1.0"
