"""From an optimized graph to one shared library: tuning tasks, kernel programs (tuned, adapted or default),
aligned thread partitions, the executor and its memory plan, in-model selection."""

#: how a model build treats records that store their kernel's arguments in layouts of their own (ALT); see
#: build.build_model (here, so the command line offers them without loading the compiler)
LAYOUT_MODES = ("propagate", "follow", "off")
