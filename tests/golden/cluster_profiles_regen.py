"""Every shipped cluster profile's composed values and the models built from it, as recorded in
cluster_profiles.json (written from main before the profile became a typed config; rewrite only on
purpose: ``python tests/golden/cluster_profiles_regen.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent / "cluster_profiles.json"


def _scrub(value: Any) -> Any:
    from pacectl.data import DATA_DIR

    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value.replace(str(DATA_DIR), "<DATA>") if isinstance(value, str) else value


def profile_values(name: str) -> dict[str, Any]:
    """The composed ``cluster`` node of ``cluster=<name>``, the models built from it and ``tune.sim``."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from pacectl.config import CONF_DIR, as_dict
    from pacectl.fabric import profile as P

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cluster = as_dict(compose(config_name="config", overrides=[f"cluster={name}"]).cluster)
        tune = compose(config_name="tune", overrides=[f"cluster={name}"]).tune
    models: dict[str, Any] = {}
    for comm in ("null", "alpha_beta", "contention"):
        model, interference = P.sim_fabric(cluster, comm, 64)
        models[comm] = [type(model).__name__, repr(model.free_time_s), repr(interference)]
    compute = P.compute_from(cluster)
    models["compute"] = [repr(compute.compute_s), [repr(c) for c in compute.components]]
    models["power_cap"] = repr(P.power_cap_from(cluster))
    models["power"] = P.power_from(cluster).name
    models["buckets"] = repr(P.buckets_spec(cluster))
    contention = P.contention_from(cluster, 64)
    models["contention_topology"] = repr(contention.topology)
    models["contention_desc"] = contention.description
    return _scrub(
        {"composed": cluster, "models": models, "tune_sim": OmegaConf.to_container(tune.sim, resolve=True)}
    )


if __name__ == "__main__":
    from pacectl.config import CONF_DIR

    names = sorted(p.stem for p in (CONF_DIR / "cluster").glob("*.yaml"))
    GOLDEN.write_text(
        json.dumps({n: profile_values(n) for n in names}, indent=1, sort_keys=True, default=str)
    )
