"""sparse-runner: reproduce and extend sparse-attention papers from one Hydra-configured runner."""

import os

# PyTorch backs CPU tensors of 2 MB and more with transparent huge pages when this is set (c10's
# alloc_cpu, PyTorch >= 2.2; read at the first large allocation, so it is set before torch allocates).
# The n x n score tensors of the explicit attention path are allocated afresh every layer and step, and
# faulting them in 4 kB pages made a 128 x 512 x 512 matmul 3-4x slower than into a reused buffer (about
# 80 ms against 21 ms). THP_MEM_ALLOC_ENABLE=0 turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"
