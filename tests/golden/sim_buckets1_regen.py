"""Digests of the single all-reduce simulator, taken before bucketed backward existed.

``python tests/golden/sim_buckets1_regen.py`` rewrites ``sim_buckets1.json``: for each case
(profile, comm model, actuator, extra overrides) and controller family, the SHA-256 of the
episode's per-iteration times, arrivals and delays (float64 bytes). ``tests/test_buckets.py``
checks that ``cluster.buckets.count=1`` (the default) reproduces every digest bit for bit. The
committed file was made at main 612c882 (the simulator before ``pacectl/fabric/overlap.py``);
regenerate it only when a change of the single all-reduce model is intended.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from pacectl.config import CONF_DIR
from pacectl.experiment import SimExperiment

OUT = Path(__file__).resolve().parent / "sim_buckets1.json"
FAMILIES = ("none", "threshold", "pid", "quantile", "sleep_wait")
#: (case name, overrides); 32 ranks x 120 iterations each
CASES = (
    ("paper_like-contention", ["cluster=paper_like", "comm=contention"]),
    ("contended-contention", ["cluster=contended", "comm=contention"]),
    # the profile called generic when the digests were taken (its values are cost_optimized's)
    ("cost_optimized-null", ["cluster=cost_optimized", "comm=null"]),
    ("paper_like-alpha_beta", ["cluster=paper_like", "comm=alpha_beta"]),
    ("paper_like-contention-clock", ["cluster=paper_like", "comm=contention", "backend.actuator=clock"]),
    (
        "paper_like-contention-powercap",
        ["cluster=paper_like", "comm=contention", "cluster.power_cap.node_w=3600"],
    ),
)


def digest(episode: object) -> str:
    h = hashlib.sha256()
    for key in ("iteration_time_s", "arrival_s", "applied_delay_s", "wait_s", "collective_time_s"):
        h.update(np.ascontiguousarray(getattr(episode, key), dtype=np.float64).tobytes())
    return h.hexdigest()


def digests(extra: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for name, overrides in CASES:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            cfg = compose(
                "config",
                overrides=[
                    "backend=sim",
                    *overrides,
                    "backend.num_ranks=32",
                    "backend.num_iterations=120",
                    *extra,
                ],
            )
        experiment = SimExperiment(cfg)
        out[name] = {}
        for family in FAMILIES:
            from pacectl.config import shipped_controller

            params = {} if family == "none" else shipped_controller(family, cfg)
            out[name][family] = digest(experiment.run(family, params))
    return out


if __name__ == "__main__":
    OUT.write_text(json.dumps(digests(tuple(sys.argv[1:])), indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
