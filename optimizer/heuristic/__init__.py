"""The polynomial-time planner: packing, placement, local search, the strategies tried in turn, and
the best static layout; each compiled loop sits beside its owner as ``*_kernels.py``."""
