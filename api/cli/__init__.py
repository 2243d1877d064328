"""The ``dhp`` command line: the top layer, which may import every other part."""

import time

STARTED = time.perf_counter()
"""When the command line's code began to load: the start of ``dhp plan``'s budget where the system does
not say when the process started (:func:`planning.deadline.process_start`)."""
