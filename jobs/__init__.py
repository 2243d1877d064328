"""Epoch planning jobs: plan every step of an epoch ahead, in parallel, into one columnar plan file.

A job reads a dataset of sample descriptors (:mod:`jobs.dataset`: JSONL or Parquet, the samples of
a batch document) or an explicit list of batches, orders it with a sampler (:mod:`jobs.samplers`:
sequential, seeded shuffle, length-grouped), cuts it into steps of the global batch size
(:mod:`jobs.steps`), plans every step with the same request template (:mod:`jobs.worker`) on an
engine (:mod:`jobs.engines`: a local process pool, or Ray tasks), keeps a journal so that a killed
job resumes where it stopped, and writes the plans as one Parquet file with a JSON index
(:mod:`jobs.planfile`) and an epoch summary (:mod:`jobs.epoch_summary`). :mod:`jobs.runner` ties these
together; :mod:`api.cli.jobs_commands` is ``dhp plan-epoch``; :mod:`trainer.epoch_plan` is the trainer side (a sampler
over the plan file; it imports torch only when asked for a torch sampler).

Planning is deterministic per step: a step's plan depends only on its samples and the template,
never on the engine, the worker count or the clock (jobs plan with the heuristic by default, whose
every loop is bounded and whose ties break on index; see :func:`jobs.spec.job_options`).

Needs ``pip install 'dhp-planner[jobs]'`` (pyarrow, tqdm); ``[ray]`` adds the Ray engine.
"""
