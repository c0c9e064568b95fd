"""Rewards from models: sequence classifiers and LLM judges, run by the job's own scoring pools.

:mod:`.models` scores (in the scoring process), :mod:`.server` is ``echorl scorer``'s HTTP service,
:mod:`.pool` is the coordinator's side: calling the pools, caching by rollout, combining by weight.
"""

TOKEN_ENV = "ECHORL_SCORER_TOKEN"
"""The variable the scorers (and the coordinator, which calls them) read the scoring pools' token from."""
