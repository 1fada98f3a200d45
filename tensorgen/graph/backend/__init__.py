"""From an optimized graph to one shared library: tuning tasks, kernel programs (tuned, adapted or default),
aligned thread partitions, the executor and its memory plan, in-model selection."""
