"""``spillway fidelity``: the same workload on the real system and in the simulator, side by
side (docs/fidelity.md). ``scale`` divides a trace and its configuration by the time scale,
``real`` runs it on real processes, ``compare`` turns both into the simulator's metrics and
their differences, ``run`` ties them together."""
