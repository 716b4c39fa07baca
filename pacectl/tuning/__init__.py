"""Tuning of pacing controllers per cluster profile (``python -m pacectl.tune``).

- :mod:`pacectl.tuning.space`: search spaces (YAML, validated before any trial);
- :mod:`pacectl.tuning.scenarios`: the episodes of a profile (traces or sim seeds) and their objectives;
- :mod:`pacectl.tuning.config`: the typed ``tune.*`` keys (``Settings``);
- :mod:`pacectl.tuning.settings`: the checks of a command, and the trial settings a resume must match;
- :mod:`pacectl.tuning.storage`: where a study lives (journal file or RDB URL), torn-journal repair;
- :mod:`pacectl.tuning.workers`: the objective, samplers, worker processes, Ctrl-C, progress lines;
- :mod:`pacectl.tuning.verdict`: dominance, the Pareto front, the choice and its judgement (pure);
- :mod:`pacectl.tuning.outputs`: ``tune.json``, ``pareto.json``/``.png``, ``controller.yaml``, console lines;
- :mod:`pacectl.tuning.study`: :func:`~pacectl.tuning.study.run_tuning`, which ties them together.

The command, and its reference for users: :mod:`pacectl.tune`.
"""
