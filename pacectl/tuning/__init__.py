"""Tuning of pacing controllers per cluster profile (``python -m pacectl.tune``).

- :mod:`pacectl.tuning.space`: search spaces (YAML, validated before any trial);
- :mod:`pacectl.tuning.scenarios`: the episodes of a profile (traces or sim seeds) and their objectives;
- :mod:`pacectl.tuning.study`: Optuna storage, samplers, workers, the Pareto front and the choice.
"""
