"""The plan: assignments, their evaluation into a plan with times, sample shards, communicators and the
readable summary."""
