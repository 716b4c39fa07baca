"""Every key of a typed config (a trace format, a backend, the guard, a controller, a cluster
profile's sections, exchange, output, the top level, analysis, tune) with a wrong type or value is
one line and exit 2, before any run folder exists (issue 22, acceptance)."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pacectl.checks import Range
from pacectl.config import RunSettings, TuneRunConfig
from pacectl.errors import config_error
from pacectl.fabric import profile as P
from pacectl.testing.commands import run_command
from pacectl.traces.formats import FORMATS


def _bad_values(cls: type, prefix: str = "") -> list[tuple[str, str]]:
    """``(key, a value it refuses)`` for every field of ``cls`` that can be wrong: a word for a
    number or a list, ``maybe`` for a boolean, a value past its range, a string not among its
    choices; a nested section's fields as ``<section>.<key>``."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        rng: Range | None = f.metadata.get("range")
        hint, key = str(hints[f.name]), prefix + f.name
        if dataclasses.is_dataclass(hints[f.name]):
            out += _bad_values(hints[f.name], f"{key}.")
        elif f.metadata.get("kind") is bool:
            out.append((key, "maybe"))
        elif f.metadata.get("choices"):
            out.append((key, "bogus"))
        elif "float" in hint or "int" in hint:
            out.append((key, "abc"))
            if rng is not None and rng.low is not None and "list" not in hint:
                out.append((key, str(rng.low if rng.low_open else rng.low - 1)))
    return out


def _registered(group: str) -> dict[str, type]:
    """The options of a config group stored in Hydra's ConfigStore, and their typed configs: what
    ``pacectl.config`` registers (every trace format, backend, controller family, ...)."""
    from hydra.core.config_store import ConfigStore

    import pacectl.config  # noqa: F401 - it registers them

    repo = ConfigStore.instance().repo[group]
    return {name.removesuffix(".yaml"): OmegaConf.get_type(entry.node) for name, entry in repo.items()}


def _noise_item(kind: str, key: str, value: str) -> str:
    """``cluster.compute.noise`` as one item of ``kind`` with ``key`` set to ``value``."""
    path = ",path:x" if kind == "empirical" else ""
    return f"cluster.compute.noise=[{{kind:{kind}{path},{key}:{value}}}]"


def _cases() -> list[tuple[list[str], str]]:
    """Every key of every registered typed config of the trace, backend, guard, controller,
    analysis and cluster groups (a cluster profile's sections and each noise kind's keys among
    them), and of the top level, with a value it refuses."""
    cases = []
    for group in ("trace", "backend", "controller", "analysis"):
        for option, cls in _registered(group).items():
            named = group == "controller" and option != "all"  # a family's messages name the bare key
            cases += [
                ([f"{group}={option}", f"{group}.{k}={v}"], k if named else f"{group}.{k}")
                for k, v in _bad_values(cls)
            ]
    (guard,) = _registered("guard").values()
    cases += [([f"guard.{k}={v}"], f"guard.{k}") for k, v in _bad_values(guard)]
    (cluster,) = _registered("cluster").values()
    cases += [([f"cluster.{k}={v}"], f"cluster.{k}") for k, v in _bad_values(cluster)]
    for kind, cls in P.NOISE_CONFIGS.items():
        cases += [([_noise_item(kind, k, v)], f"cluster.compute.noise.0.{k}") for k, v in _bad_values(cls)]
    cases += [([f"{k}={v}"], k) for k, v in _bad_values(RunSettings)]
    return cases


@pytest.mark.parametrize(("args", "key"), _cases(), ids=lambda a: " ".join(a) if isinstance(a, list) else "")
def test_a_wrong_value_of_a_typed_key_is_one_line(tmp_path: Path, args: list[str], key: str) -> None:
    from pacectl.run import main

    out = tmp_path / "run"
    trace = [] if any(a.startswith("trace") for a in args) else ["trace=st"]
    proc = run_command(main, [*trace, *args, f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("warning")]
    assert len(lines) == 1 and key in lines[0] and " must be " in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


@pytest.mark.parametrize(
    ("arg", "expect"),
    [
        ("cluster.jobs=abc", "cluster.jobs must be"),
        ("cluster.jobs.0=abc", "cluster.jobs.0 must be"),
        ("cluster.jobs.0.name=[1,2]", "cluster.jobs.0.name must be"),
        ("cluster.jobs.0.ranks=abc", "cluster.jobs.0.ranks entries must be"),
        ("cluster.jobs.0.ranks=[]", "cluster.jobs.0.ranks must be a non-empty list"),
        ("cluster.jobs.0.message_bytes=abc", "cluster.jobs.0.message_bytes must be"),
        ("cluster.jobs.0.start_s=-1", "cluster.jobs.0.start_s must be"),
        ("cluster.jobs.0.compute=abc", "cluster.jobs.0.compute must be"),
        (
            "cluster.jobs.0.compute.compute_s=abc",
            "cluster.jobs.0.compute.compute_s must be a finite number > 0, got 'abc'",
        ),
        ("cluster.jobs.0.compute.noise=abc", "cluster.jobs.0.compute.noise must be"),
        ("+cluster.jobs.0.controller=5", "cluster.jobs.0.controller must be"),
        ("cluster.jobs.0.controller=[1]", "cluster.jobs.0.controller must be a string or null, got [1]: for"),
        ("cluster.jobs.0.controller_params=abc", "cluster.jobs.0.controller_params must be a mapping"),
        ("+cluster.jobs.0.controller_params.phase=5", "cluster.jobs.0.controller_params.phase must be"),
        (
            "cluster.jobs.0.start_s=nan",
            "cluster.jobs.0.start_s must be a finite number >= 0 (seconds), got nan",
        ),
        ("cluster.jobs.0.message_bytes=-1", "cluster.jobs.0.message_bytes must be a finite number >= 0"),
        # a misspelt key (set or added: refused by the typed entry), and a job the profile does not have
        (
            "cluster.jobs.0.rank=[1]",
            "no such config key (known under cluster.jobs.0: ['compute', 'controller',",
        ),
        ("+cluster.jobs.0.rank=[1]", "cluster.jobs.0.rank: no such key (known: name, ranks,"),
        (
            "+cluster.jobs.0.compute.bogus=1",
            "cluster.jobs.0.compute.bogus: no such key (known: compute_s, noise)",
        ),
        (
            "cluster.jobs.0.compute.bogus=1",
            "no such config key (known under cluster.jobs.0.compute: ['compute_s', 'noise'])",
        ),
        (
            "cluster.jobs.5.ranks=[1]",
            "cluster.jobs has 2 entries (cluster.jobs.0 to cluster.jobs.1), so there is no cluster.jobs.5",
        ),
    ],
)
def test_a_wrong_job_key_is_one_line(tmp_path: Path, arg: str, expect: str) -> None:
    """``cluster.jobs.<i>.*`` (several jobs on one fabric, :mod:`pacectl.fabric.jobs`): a wrong type
    or value, a misspelt key or a job past the list's end."""
    from pacectl.run import main

    out = tmp_path / "run"
    proc = run_command(
        main, ["backend=sim", "cluster=shared_uplink", arg, f"hydra.run.dir={out}"], cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("warning")]
    assert len(lines) == 1 and expect in lines[0] and "???" not in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
    if arg == "cluster.jobs.0.rank=[1]":
        assert "Did you mean cluster.jobs.0.ranks=[1]?" in lines[0]


def _tune_cases() -> list[tuple[list[str], str]]:
    """Every key of ``tune`` (``tune.sim``'s among them) as pacectl.tune's config types it."""
    tune = typing.get_type_hints(TuneRunConfig)["tune"]
    return [([f"tune.{k}={v}"], f"tune.{k}") for k, v in _bad_values(tune)]


@pytest.mark.parametrize(
    ("args", "key"), _tune_cases(), ids=lambda a: " ".join(a) if isinstance(a, list) else ""
)
def test_a_wrong_tune_value_is_one_line(tmp_path: Path, args: list[str], key: str) -> None:
    from pacectl.tune import main

    out = tmp_path / "run"
    proc = run_command(main, ["cluster=contended", *args, f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("warning")]
    assert len(lines) == 1 and key in lines[0] and " must be " in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_the_formatter_names_key_value_constraint_example_and_a_near_key() -> None:
    node = OmegaConf.structured(FORMATS["steplevel"])
    with pytest.raises(Exception) as info:
        OmegaConf.merge(node, {"unit_s": "fast"})
    assert config_error(info.value) == (
        "unit_s must be a finite number > 0, got 'fast': for example unit_s=0.001"
    )
    with pytest.raises(Exception) as info:
        OmegaConf.merge(node, {"unit": 1})
    assert "did you mean unit_s?" in config_error(info.value)


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["backend=torch", "backend.nproc_per_node=2,0"], "backend.nproc_per_node"),
        (["backend=torch", "backend.pacing.gather=async,sometimes"], "backend.pacing.gather"),
        (["backend=torch", "backend.straggler.prob=0.5,2"], "backend.straggler.prob"),
        (["backend=torch", "backend.socket_ifname=lo,no_such_nic0"], "backend.socket_ifname"),
        (["backend=sim", "backend.actuator=delay,clok"], "backend.actuator"),
        (["backend=sim", "backend.num_iterations=5,0"], "backend.num_iterations"),
        (["backend=replay", "trace=st", "backend.actuator=clock,bogus"], "backend.actuator"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else "",
)
def test_a_sweep_refuses_a_bad_backend_value_before_its_first_job(
    tmp_path: Path, args: list[str], key: str
) -> None:
    """``-m``: every job's backend.* is checked by its typed config (backend=torch: torch_config,
    torch not imported) before the first job runs, so the good first job does not run either."""
    from pacectl.run import main

    out = tmp_path / "sweep"
    proc = run_command(main, ["-m", *args, f"hydra.sweep.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("warning")]
    assert len(lines) == 1 and lines[0].startswith("pacectl.run: error: sweep job (") and key in lines[0], (
        lines
    )
    assert "Traceback" not in proc.stderr and not out.exists()


def test_the_backend_ranges_are_the_typed_configs_own() -> None:
    """The experiments read replay/sim's settings through their typed config: a value out of a
    declared range is refused there too, for a caller in Python."""
    from pacectl.errors import ConfigError
    from pacectl.experiment import SimExperiment

    cfg = OmegaConf.create({"backend": {"name": "sim", "num_ranks": 4, "num_iterations": -1}, "cluster": {}})
    with pytest.raises(ConfigError, match=r"^backend\.num_iterations must be an integer >= 1, got -1"):
        SimExperiment(cfg)


_JOB_A = '  - {name: a, ranks: ["0-7", "16-23"], compute: {compute_s: 0.3}}\n'
_JOB_B = '  - name: b\n    ranks: ["8-15", "24-31"]\n'


@pytest.mark.parametrize(
    ("jobs", "expect"),
    [
        (
            _JOB_A + _JOB_B + "    strat_s: 0.2\n",
            "cluster.jobs.1.strat_s: no such key (known: name, ranks, compute, message_bytes, start_s, "
            "controller, controller_params); did you mean cluster.jobs.1.start_s?",
        ),
        (
            _JOB_A + _JOB_B + "    start_s: abc\n",
            "cluster.jobs.1.start_s must be a finite number >= 0 (seconds), got 'abc'",
        ),
        (
            _JOB_A + _JOB_B + "    compute: {compute_s: fast}\n",
            "cluster.jobs.1.compute.compute_s must be a finite number > 0",
        ),
        (_JOB_B + "    strat_s: 0.2\n" + _JOB_A, "cluster.jobs.0.strat_s: no such key"),  # the first entry
        (
            _JOB_A + _JOB_B + '  - {name: c, ranks: ["32-39"], start_s: -1}\n',
            "cluster.jobs.2.start_s must be",
        ),
        # an entry that cannot be checked again (a broken interpolation): named by its job instead
        (
            _JOB_A + _JOB_B + "    start_s: ${nope}\n    strat_s: 0.2\n",
            "cluster.jobs.<i>.strat_s: no such key (known: name, ranks, compute, message_bytes, start_s, "
            "controller, controller_params); did you mean cluster.jobs.<i>.start_s? (the entry of job 'b')",
        ),
    ],
)
def test_a_wrong_job_key_in_a_profile_file_is_one_line(tmp_path: Path, jobs: str, expect: str) -> None:
    """A job entry of a profile's YAML is checked by OmegaConf on its own, without its index; the line
    names the entry by its index (the entries checked again, one by one), the key and the fix, and
    says that the fault is in a file."""
    from pacectl.run import main

    (tmp_path / "conf" / "cluster").mkdir(parents=True)
    (tmp_path / "conf" / "cluster" / "badjob.yaml").write_text(
        "defaults:\n  - shared_uplink\n  - _self_\nname: badjob\njobs:\n" + jobs
    )
    out = tmp_path / "run"
    args = ["backend=sim", "cluster=badjob", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"]
    proc = run_command(main, [*args, f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("warning")]
    assert len(lines) == 1 and expect in lines[0], proc.stderr
    assert lines[0].endswith("(in the YAML of cluster=badjob, not an override: fix the file)")
    assert "Traceback" not in proc.stderr and not out.exists()


def test_a_value_out_of_range_in_a_preset_file_names_the_file(tmp_path: Path) -> None:
    """A range check (``__post_init__``) on a value a preset YAML set names that file, not an override;
    the same value given as an override keeps the override hint."""
    from pacectl.run import main

    (tmp_path / "conf" / "controller").mkdir(parents=True)
    (tmp_path / "conf" / "controller" / "mypid.yaml").write_text("defaults:\n  - pid\n  - _self_\nkp: -3\n")
    args = [
        "controller=mypid",
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        f"hydra.run.dir={tmp_path / 'r'}",
    ]
    proc = run_command(main, args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().endswith(
        "kp must be >= 0, got -3.0 (controller 'pid'; in the YAML of controller=mypid, not an override: fix the file)"
    ), proc.stderr
    proc = run_command(main, [*args, "controller.kp=-1"], cwd=tmp_path)
    assert proc.returncode == 2 and "got -1.0 (controller 'pid'; override: controller.kp=" in proc.stderr


@pytest.mark.parametrize(
    ("yaml", "extra", "expect"),
    [
        # a mapping override above the key merges: the value still comes from the file
        (
            "interference:\n  kappa: -1.0\n",
            ["cluster.interference={kappa_source: measured}"],
            "kappa must be >= 0, got -1.0 (in the YAML of cluster=bad, not an override: fix the file)",
        ),
        ("interference:\n  kappa: -1.0\n", ["cluster.interference={kappa: -2}"], "got -2.0 (override: "),
        # checked when the job builds its controllers, after the command line's checks
        (
            "jobs:\n"
            '  - {name: a, ranks: ["0-7", "16-23"], compute: {compute_s: 0.3}, controller: pid,'
            " controller_params: {pid: {kp: -1}}}\n"
            '  - {name: b, ranks: ["8-15", "24-31"], compute: {compute_s: 0.6}}\n',
            [],
            "controller_params.pid.kp must be >= 0, got -1 (in the YAML of cluster=bad, not an override",
        ),
    ],
)
def test_a_file_value_under_a_merged_override_or_checked_in_the_job_names_the_file(
    tmp_path: Path, yaml: str, extra: list[str], expect: str
) -> None:
    from pacectl.run import main

    (tmp_path / "conf" / "cluster").mkdir(parents=True)
    (tmp_path / "conf" / "cluster" / "bad.yaml").write_text(
        "defaults:\n  - shared_uplink\n  - _self_\nname: bad\n" + yaml
    )
    out = tmp_path / "run"
    args = ["backend=sim", "cluster=bad", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", *extra]
    proc = run_command(main, [*args, f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 2 and expect in proc.stderr, proc.stderr
    assert not out.exists()


def test_a_controller_file_value_out_of_range_is_fixed_in_the_file(tmp_path: Path) -> None:
    from pacectl.run import main

    (tmp_path / "ctl.yaml").write_text("name: pid\nkp: -3\n")
    proc = run_command(
        main, [f"controller_file={tmp_path / 'ctl.yaml'}", f"hydra.run.dir={tmp_path / 'r'}"], cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    assert "kp must be >= 0, got -3 (controller 'pid'; fix it in the file). Such a file holds" in proc.stderr
