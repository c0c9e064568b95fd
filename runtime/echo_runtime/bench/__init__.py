"""Benchmarks and models of Echo's performance: ``echorl simulate`` and ``echorl bench``.

* :mod:`.simulate` — a discrete-event simulator of the coordinator's protocols for swarms far larger
  than one machine (pool sizing before buying hardware), and its fit to measured local runs;
* :mod:`.fidelity` — the statistics of backend fidelity: behaviour vs. recomputed log-probs, a
  sequence-level KL estimate, two-sample tests on reward distributions (pure, numpy only);
* :mod:`.fidelity_run` — the I/O shell that samples from real backends and feeds :mod:`.fidelity`.

Importing this package imports no ML framework.
"""
