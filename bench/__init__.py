"""Benchmarks of the planner against static and dynamic baselines under one cost model.

``dhp bench`` (see :mod:`api.cli.bench_commands`) runs a grid of workloads x cluster sizes x batch sizes, plans
every batch with every planner, verifies every answer with :func:`optimizer.verify.verifier.check_assignment`
and writes a JSON file, a Markdown report and PNG plots.
"""
