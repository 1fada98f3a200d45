"""AutoTVM (Chen et al., NeurIPS 2018): templates with knobs make a configuration space; a rank model over the
knobs picks, by simulated annealing, which configs to measure next, and learns from the measurements.

`space` (knobs, ConfigSpace), `templates` (TEMPLATES: dense, conv2d, generic), `anneal` (simulated annealing),
`tuner` (AutoTVMPolicy, the search policy "autotvm": `tensorgen.tune(dag, policy="autotvm")`).
"""
