"""Student's t 97.5 % quantiles, ``T975[dof - 1] == float(scipy.special.stdtrit(dof, 0.975))`` for
``dof`` 1 to 2048: the interval half-widths of :mod:`pacectl.metrics` without importing scipy (about
0.2-0.4 s of a command's start-up on the 2-core machine; experiments/bench/README.md).

The values are package data, ``_t975.json`` beside this file (read when this module is first
imported, which :mod:`pacectl.metrics` does only when it needs a quantile), written by
``python -m pacectl._t975`` with the scipy named in it; ``tests/test_metrics.py`` checks every value
against the installed scipy, bit for bit (JSON keeps a float's shortest repr, which reads back to the
same float). The table is used only where the installed scipy is the version that wrote it
(:data:`SCIPY_VERSION`, read from the package metadata without importing scipy); under any other
version, or where the file is missing or damaged, :func:`pacectl.metrics._t975` asks scipy itself,
so a table never outlives its source.
"""

from __future__ import annotations

import json
from pathlib import Path

_PATH = Path(__file__).with_name("_t975.json")
try:
    _DATA = json.loads(_PATH.read_text(encoding="utf-8"))
    #: The scipy whose stdtrit wrote :data:`T975` (``_write`` keeps the two together).
    SCIPY_VERSION: str = str(_DATA["scipy_version"])
    T975: tuple[float, ...] = tuple(float(v) for v in _DATA["t975"])
except (OSError, ValueError, KeyError, TypeError):  # missing or damaged: no table, scipy answers
    SCIPY_VERSION, T975 = "", ()


def _write(max_dof: int = 2048) -> None:  # pragma: no cover - regenerates the table
    import scipy
    from scipy.special import stdtrit

    values = ",\n".join(f"    {float(stdtrit(d, 0.975))!r}" for d in range(1, max_dof + 1))
    _PATH.write_text(
        f'{{\n  "scipy_version": {json.dumps(scipy.__version__)},\n  "t975": [\n{values}\n  ]\n}}\n',
        encoding="utf-8",
    )


if __name__ == "__main__":
    _write()
