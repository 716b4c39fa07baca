"""From a composed Hydra config to pacectl objects: traces, backends and guarded controllers.

The configs live in the top-level ``conf/`` of a checkout; a wheel ships the same files as
``pacectl/conf/``. :data:`CONF_DIR` is whichever exists. The resolver ``${pacectl_data:<rel>}``
points at the traces shipped inside the package (``pacectl/data/<rel>``).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from pacectl.backends.replay import ReplayConfig
from pacectl.backends.sim import SimConfig
from pacectl.checks import Checked, flag, integer, structured, typed, within
from pacectl.controllers import (
    SCHEDULE_KEYS,
    SafetyGuard,
    all_families,
    family,
    fill_schedule,
    make_controller,
    schedule_keys,
)
from pacectl.controllers.guard import GuardConfig
from pacectl.controllers.registry import Family, subscribe
from pacectl.controllers.units import UNITS
from pacectl.data import DATA_DIR
from pacectl.errors import ConfigError, did_you_mean, unknown_keys_error, yaml_problem
from pacectl.fabric.base import CommModel, NullComm
from pacectl.fabric.profile import COMM_NAMES, ClusterConfig, JobEntry
from pacectl.loop import ExchangeSchedule
from pacectl.torchdist.core import TorchConfig  # torch-free
from pacectl.traces.formats import FORMATS, trace_config, user_path
from pacectl.traces.model import OpTrace
from pacectl.tuning.config import Settings
from pacectl.types import Controller

_PKG_DIR = Path(__file__).resolve().parent
#: The Hydra config directory: ``pacectl/conf`` in a wheel, ``<checkout>/conf`` in a checkout.
CONF_DIR = _PKG_DIR / "conf" if (_PKG_DIR / "conf").is_dir() else _PKG_DIR.parent / "conf"

if not OmegaConf.has_resolver("pacectl_data"):
    OmegaConf.register_new_resolver("pacectl_data", lambda rel: str(DATA_DIR / rel))
if not OmegaConf.has_resolver("pacectl_controllers"):  # the --help footers' list of families
    from pacectl.controllers.registry import describe

    OmegaConf.register_new_resolver("pacectl_controllers", describe)


@dataclass(kw_only=True)
class Exchange(Checked):
    """``exchange``: when a decision reaches the ranks, in replay and sim. A decision taken on the
    figures of iteration k paces from iteration k + ``lag_iters`` (1: the next one, figures known at
    once); the figures are exchanged ``every_iters`` iterations at a time (the decision on a group's
    last iteration counts). A live job exchanges them before deciding (``backend=torch`` takes
    ``backend.pacing.gather``: async or collective is lag 1, piggyback lag 2; ``gather_every`` is
    ``every_iters``). experiments/staleness measures what lag costs."""

    section: ClassVar[str] = "exchange"
    lag_iters: int = within(1, ">= 1")
    every_iters: int = within(1, ">= 1")


@dataclass(kw_only=True)
class Output(Checked):
    """``output``: the files a run writes besides ``summary.json``: ``iterations.parquet`` (per run,
    iteration and rank: ~200 B per rank-iteration and run; false for very large simulations), the
    PNG plots and ``report.md``."""

    section: ClassVar[str] = "output"
    iterations: Any = flag(True)
    plots: Any = flag(True)
    report: Any = flag(True)


@dataclass(kw_only=True)
class RunSettings(Checked):
    """The top-level keys of ``pacectl.run`` besides its config groups. ``comm``: the communication
    model (null: fixed durations, max-plus; alpha_beta; contention; fitted: replay only, options in
    ``fit``, :func:`pacectl.fabric.fitted.fit_options`); ``controller_file``: a controller YAML
    (``pacectl.tune`` writes one) in place of the ``controller`` group; ``seed``: the run's seed."""

    exchange: Exchange = field(default_factory=Exchange)
    output: Output = field(default_factory=Output)
    comm: str | None = within("null", choices=COMM_NAMES)
    fit: Any = MISSING
    seed: int = within(0, ">= 0")
    controller_file: str | None = None


@dataclass(kw_only=True)
class RunConfig(RunSettings):
    """``pacectl.run``'s whole config (``run_schema``, the first default of conf/config.yaml): the
    config groups, each typed by its option, and :class:`RunSettings`. Hydra refuses another key."""

    backend: Any = MISSING
    trace: Any = MISSING
    controller: Any = MISSING
    cluster: Any = MISSING
    analysis: Any = MISSING
    guard: Any = MISSING


@dataclass(kw_only=True)
class TuneRunConfig(RunConfig):
    """``pacectl.tune``'s whole config (``tune_schema``, conf/tune.yaml): pacectl.run's and ``tune``
    (:class:`pacectl.tuning.config.Settings`)."""

    tune: Settings = field(default_factory=Settings)


@dataclass(kw_only=True)
class Pacing(Checked):
    """``analysis=pacing``: replay the trace under no pacing and the selected controller(s), side by
    side. ``whatif`` (replay only): first put the stragglers' cost in the summary (the what-if
    analysis, Lin et al. OSDI 2025, as analysis=whatif runs it: :mod:`pacectl.whatif`)."""

    section: ClassVar[str] = "analysis"
    name: str = "pacing"
    whatif: Any = flag(True)


@dataclass(kw_only=True)
class Whatif(Checked):
    """``analysis=whatif``: how much do stragglers cost, and who causes it (Lin et al., OSDI 2025)?
    Writes whatif.json, whatif_heatmap.png and timeline.json (open it in https://ui.perfetto.dev) of
    the recorded step at position ``timeline_step_index`` (0-based)."""

    section: ClassVar[str] = "analysis"
    name: str = "whatif"
    timeline_step_index: int = within(0, ">= 0")


@dataclass(kw_only=True)
class AllControllers(Checked):
    """``controller=all`` (the default): every registered family marked for it
    (:func:`pacectl.controllers.all_families`: not sleep_wait, the bar a per-rank controller must beat
    where early-arrival interference is the mechanism, nor phase, job-level), each with its
    constructor defaults; ``families`` picks others (``'controller.families=[threshold,sleep_wait]'``),
    ``units`` (s or iteration) applies to every family. It takes no other parameters."""

    section: ClassVar[str] = "controller"
    name: str = "all"
    families: list[str] | None = None
    units: str = within("s", choices=UNITS)


def _store_family(fam: Family, registered: bool) -> None:
    """Keep the ``controller`` config group in step with the registry: every registered family is
    an option (``controller=<family>``), its typed fields the config (:meth:`Family.node`)."""
    store = ConfigStore.instance()
    if registered:
        store.store(group="controller", name=fam.name, node=fam.node())
    else:
        store.repo.get("controller", {}).pop(f"{fam.name}.yaml", None)


subscribe(_store_family)
_store = ConfigStore.instance()
_store.store(group="guard", name="default", node=GuardConfig)
for _name, _format in FORMATS.items():  # trace=<format>: its typed config
    _store.store(group="trace", name=_name, node=_format)
_store.store(group="backend", name="replay", node=ReplayConfig)
_store.store(group="backend", name="sim", node=SimConfig)
_store.store(group="backend", name="torch", node=TorchConfig)
_store.store(group="cluster", name="base", node=structured(ClusterConfig))  # conf/cluster/ builds on it
_store.store(group="analysis", name="pacing", node=Pacing)
_store.store(group="analysis", name="whatif", node=Whatif)
_store.store(group="controller", name="all", node=AllControllers)
_store.store(name="run_schema", node=RunConfig)
_store.store(name="tune_schema", node=TuneRunConfig)


def job_entry_error(compose: Callable[[], DictConfig]) -> str | None:
    """The line for the first bad entry of a profile's ``cluster.jobs``, under its index, or None.

    While Hydra merges a profile's YAML into the typed ``cluster=base``, OmegaConf checks each entry
    of the typed list ``jobs`` on its own, so its error has no index. ``compose`` runs again on an
    untyped copy of ``cluster=base`` (the schema restored after it), and each entry is checked as a
    :class:`~pacectl.fabric.profile.JobEntry` under ``cluster.jobs.<i>``. None: every entry passes,
    or the untyped composition fails too. The swap of the stored schema is process-wide and not
    thread-safe: call it only from the entry point's thread, before any job runs.
    """
    plain = OmegaConf.create(OmegaConf.to_container(structured(ClusterConfig)))
    _store.store(group="cluster", name="base", node=plain)
    try:
        jobs = compose().cluster.get("jobs") or []
        for i, entry in enumerate(jobs):
            typed(JobEntry, entry, f"cluster.jobs.{i}")
    except ConfigError as err:
        return str(err)
    except Exception:  # noqa: BLE001 - only for a better line: the caller keeps its own
        return None
    finally:
        _store.store(group="cluster", name="base", node=structured(ClusterConfig))
    return None


def load_trace(trace_cfg: DictConfig) -> OpTrace:
    """Load the trace named by the ``trace`` config group (its typed config, :mod:`pacectl.traces.formats`).

    Raises:
        ConfigError: unknown ``trace.format``, or a value out of range.
        TraceError: the file is missing or malformed.
    """
    trace = trace_config(trace_cfg).load()
    if trace_cfg.get("name"):
        object.__setattr__(trace.meta, "name", str(trace_cfg.name))
    return trace


def make_comm_model(cfg: DictConfig, num_ranks: int) -> CommModel:
    """The replay's communication model for ``cfg.comm`` and the ``cluster`` profile.

    Raises:
        ConfigError: unknown ``comm``, or ``alpha_beta`` (it needs message sizes, which recorded
            traces do not carry).
    """
    from pacectl.fabric.profile import ReplayContention, comm_name

    name = comm_name(cfg.get("comm"))
    if name == "null":
        return NullComm()
    if name == "contention":
        return ReplayContention(as_dict(cfg.cluster), num_ranks)
    raise ConfigError(
        "comm must be null or contention for backend=replay, got 'alpha_beta': recorded traces carry no "
        "message sizes for its closed form. Use comm=contention, or backend=sim for alpha_beta."
    )


def as_dict(node: DictConfig) -> dict[str, Any]:
    """A config node as a plain ``dict`` with interpolations resolved (ConfigError if not a mapping)."""
    value = OmegaConf.to_container(node, resolve=True)
    if not isinstance(value, dict):
        raise ConfigError(f"expected a mapping, got {value!r}")
    return {str(k): v for k, v in value.items()}


def controller_params(controller_cfg: DictConfig | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Split a controller config into its family name and constructor parameters."""
    raw = (
        OmegaConf.to_container(controller_cfg, resolve=True)
        if isinstance(controller_cfg, DictConfig)
        else controller_cfg
    )
    if not isinstance(raw, dict):
        raise ConfigError(f"controller config must be a mapping, got {raw!r}")
    params: dict[str, Any] = {str(k): v for k, v in raw.items()}
    name = params.pop("name", None)
    if not isinstance(name, str):
        raise ConfigError(f"controller.name must be a controller family name, got {name!r}")
    return name, params


def _flagged_header(text: str) -> list[str]:
    """The ``# WARNING`` paragraph of a controller file's header (``pacectl.tune`` writes it when no
    trial improves on no pacing): the WARNING line and the comment lines after it, up to ``# Use:``."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("# WARNING") or (out and line.startswith("# ") and not line.startswith("# Use:")):
            out.append(line[1:].strip())
        elif out:
            break
    return out


def selected_controller(cfg: DictConfig) -> DictConfig:
    """The controller config of ``cfg``: the ``controller`` group, or the file ``controller_file``.

    ``controller_file=PATH`` (a top-level key, default null) loads a controller YAML written by
    ``python -m pacectl.tune`` (``name`` plus constructor parameters) in place of the ``controller``
    group: ``python -m pacectl.run controller_file=DIR/controller.yaml``.

    Raises:
        ConfigError: the file is missing, unreadable or not a mapping.
    """
    path = cfg.get("controller_file")
    if path is None or str(path) == "":
        return cfg.controller  # type: ignore[no-any-return]
    file = Path(user_path(str(path), "controller_file"))
    if not file.is_file():
        raise ConfigError(
            f"controller_file must be an existing controller YAML, got {str(path)!r} (resolved to {file}); "
            "python -m pacectl.tune writes one as <run dir>/controller.yaml"
        )
    try:
        node = OmegaConf.load(file)
    except Exception as err:  # yaml.YAMLError, OSError, omegaconf errors
        raise ConfigError(
            f"controller_file {str(file)!r} must be valid YAML: {yaml_problem(err)}; fix the file"
        ) from err
    if not isinstance(node, DictConfig):
        raise ConfigError(f"controller_file {str(file)!r} must hold a mapping with a 'name', got {node!r}")
    text = file.read_text()
    flagged = _flagged_header(text)
    if flagged:  # pacectl.tune found nothing better than no pacing
        warnings.warn(f"controller_file {file}: {' '.join(flagged)}", UserWarning, stacklevel=2)
    elsewhere = tuned_elsewhere(text, cfg)
    if elsewhere:
        advice = (
            "its thresholds are in iteration units, which transfer better than seconds, but were not "
            "tested here"
            if node.get("units") == "iteration"
            else "tuned thresholds in seconds need not transfer between jobs (experiments/tuning: tuned on "
            "ST, the threshold controller raised AR's CV); tune on this setting, or with "
            "controller.units=iteration"
        )
        warnings.warn(
            f"controller_file {file} was tuned for {' '.join(elsewhere[0])}, and this run has "
            f"{' '.join(elsewhere[1])}: {advice}",
            UserWarning,
            stacklevel=2,
        )
    return node


def tuned_elsewhere(header: str, cfg: DictConfig) -> tuple[list[str], list[str]] | None:
    """Where a tuned controller file's ``# Use:`` line differs from this run, or None.

    ``pacectl.tune`` writes ``# Use: python -m pacectl.run controller_file=<this file> trace=st`` (or
    the sim profile's ``backend=sim cluster=... comm=...``). Each of its group choices (``trace``,
    ``backend``, ``cluster``, ``comm``) is compared with this run's Hydra choices, when Hydra runs.

    Returns:
        ``(the file's overrides that differ, this run's values for them)``.
    """
    use = next((line for line in header.splitlines() if line.startswith("# Use:")), None)
    if use is None:
        return None
    try:
        from hydra.core.hydra_config import HydraConfig

        choices = dict(HydraConfig.get().runtime.choices)
    except ValueError:  # not inside a Hydra app (a library call): nothing to compare with
        return None
    return use_line_differences(use, {str(k): str(v) for k, v in choices.items() if v is not None})


def use_line_differences(use: str, choices: dict[str, str]) -> tuple[list[str], list[str]] | None:
    """The group choices of a ``# Use:`` line that differ from ``choices`` (this run's), or None.

    Only what this run reads is compared: the trace only between replays, and for a live run
    (``backend=torch``, whose fabric is real) only the backend.
    """
    given = dict(t.partition("=")[::2] for t in use.split()[1:] if "=" in t)
    given.setdefault("backend", "replay")  # the Use line leaves the default backend out
    backend = str(choices.get("backend"))
    theirs, ours = [], []
    for key in ("backend", "trace", "cluster", "comm"):
        if key not in given or (key == "trace" and (backend != "replay" or given["backend"] != "replay")):
            continue  # only a replay reads a trace
        if key != "backend" and backend == "torch":
            continue  # a live run reads neither a trace nor a modelled fabric: its own is real
        current = choices.get(key)
        if current is not None and str(current) != given[key]:
            theirs.append(f"{key}={given[key]}")
            ours.append(f"{key}={current}")
    return (theirs, ours) if theirs else None


def controller_families(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """The runs of an experiment: ``none`` first, then the selected controller(s)
    (:func:`selected_controller`; ``controller=all``: :class:`AllControllers`), each family's
    parameters checked by building it.

    Raises:
        ConfigError: an unknown family or a bad parameter (naming ``controller_file`` where one is used).
    """
    try:
        return _controller_runs(cfg)
    except ConfigError as err:
        if cfg.get("controller_file") in (None, "") or "controller_file" in str(err):  # no file, or named
            raise
        text = str(err).replace(err.hint, "fix it in the file") if err.hint else str(err)
        end = "" if text.endswith((".", "?", "!")) else "."
        raise ConfigError(
            f"controller_file {str(cfg.controller_file)!r}: {text}{end} Such a file holds 'name: <family>' "
            "plus that family's parameters, as python -m pacectl.tune writes it (<run dir>/controller.yaml)"
        ) from None


def _controller_runs(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    name, params = controller_params(selected_controller(cfg))
    runs: dict[str, dict[str, Any]] = {"none": {}}
    if name == "all":
        units = params.get("units")  # controller=all controller.units=iteration: every family in those units
        chosen = params.get("families")
        for name_ in all_families() if chosen is None else chosen:
            fam_params = _family_defaults(name_, "controller.families entries")
            if units is not None:
                fam_params["units"] = units
            runs[name_] = fam_params
    elif name != "none":
        runs[name] = params
    for name_, family_params in runs.items():
        resolve_auto_horizon(name_, family_params, cfg)
        make_controller(name_, **family_params)  # validate every config before any run starts
    return runs


def decision_schedule(cfg: DictConfig) -> ExchangeSchedule:
    """When this run's decisions reach the ranks: the lag from an observation to the first iteration
    its decision paces, and how many iterations a decision stays in force.

    Replay and sim: ``exchange.lag_iters`` and ``exchange.every_iters``. ``backend=torch``: the lag
    of the exchange that ``backend.pacing.gather`` resolves to (2 for piggyback, 1 for async and
    collective; ``auto`` is async on gloo, piggyback on NCCL, see
    :func:`pacectl.torchdist.core.exchange_lag`) and ``backend.pacing.gather_every``.

    Raises:
        ConfigError: a bad ``exchange`` block or ``gather_every``.
    """
    backend = cfg.get("backend")
    if isinstance(backend, DictConfig) and backend.get("name") == "torch":
        from pacectl.torchdist.core import BUILTIN_DIST_BACKEND, exchange_lag, resolve_gather  # no torch

        pacing = backend.get("pacing")
        pacing = pacing if isinstance(pacing, DictConfig) else OmegaConf.create({})
        gather = resolve_gather(str(pacing.get("gather", "auto")), BUILTIN_DIST_BACKEND)
        every = integer(pacing.get("gather_every", 1), "backend.pacing.gather_every", low=1)
        return ExchangeSchedule(lag=exchange_lag(gather), every=every)
    return exchange_schedule(cfg)


def _family_defaults(name: str, what: str) -> dict[str, Any]:
    """A registered family's config (its constructor defaults, ``auto`` schedule keys) without its
    ``name`` (``what`` names the setting, for the error)."""
    try:
        params = family(str(name)).config()
    except ConfigError as err:
        raise ConfigError(f"{what}: {err}") from None
    params.pop("name")
    return params


def shipped_controller(name: str, cfg: DictConfig) -> dict[str, Any]:
    """The default parameters of the registered family ``name``, ``auto`` horizons resolved for
    ``cfg`` (:func:`resolve_auto_horizon`).

    Raises:
        ConfigError: no such family.
    """
    return resolve_auto_horizon(name, _family_defaults(name, "a controller family"), cfg)


def resolve_auto_horizon(family: str, params: dict[str, Any], cfg: DictConfig) -> dict[str, Any]:
    """Set a forecast's ``horizon_iters`` / ``hold_iters`` (``auto`` or missing) from the run's
    :func:`decision_schedule` (its lag / its every), in place (:func:`pacectl.controllers.fill_schedule`).

    A forecast must look as far ahead as the decision travels, and over as many iterations as it
    holds: ``exchange.lag_iters=2`` (or a live piggyback exchange) paces from two iterations after
    the observation, and ``exchange.every_iters=10`` (live ``gather_every=10``) keeps it ten. An
    explicit value that differs from the run's warns (one line, kept in ``summary.json``).

    Returns:
        ``params``.
    """
    if not schedule_keys(family):
        return params
    schedule = decision_schedule(cfg)
    given = [key for key in SCHEDULE_KEYS if key in params and params[key] != "auto"]
    fill_schedule(family, params, schedule.lag, schedule.every)  # checks and normalizes the given ones
    run = dict(zip(SCHEDULE_KEYS, (schedule.lag, schedule.every), strict=True))
    differ = [f"{key}={params[key]!r} (this run: {run[key]})" for key in given if params[key] != run[key]]
    if differ:
        warnings.warn(
            f"controller {family!r}: {', '.join(differ)}: its forecasts are for other iterations than "
            "its decisions pace; set them to auto (or leave them out) to follow the run's exchange",
            stacklevel=2,
        )
    return params


def controller_factory(
    family: str, params: dict[str, Any], guard_cfg: DictConfig
) -> Callable[[], Controller]:
    """A factory of guarded controllers (one is built per pacing domain)."""
    guard = as_dict(guard_cfg)

    def build() -> Controller:
        return SafetyGuard(make_controller(family, **params), **guard)  # type: ignore[arg-type]

    return build


def validate_run_config(cfg: DictConfig) -> None:
    """Check what Hydra's composition cannot: keys added with ``+`` (Hydra lets them past a typed
    config), each typed section's ranges (its dataclass, :mod:`pacectl.checks`), and values that
    depend on one another (the backend and ``exchange``, ``analysis=whatif``), before any work.

    Raises:
        ConfigError: with the key, the bad value and how to fix it.
    """
    _check_known_keys(cfg)
    root = OmegaConf.get_type(cfg)
    if isinstance(root, type) and issubclass(root, RunSettings):
        own = [f.name for f in dataclasses.fields(RunSettings)]
        typed(RunSettings, OmegaConf.masked_copy(cfg, own))
    # the typed groups' ranges; a controller family's when it is built, backend=torch's by
    # torch_config (it also looks at this machine: pacectl.run checks it before any job)
    for key in ("cluster", "analysis", "controller", "backend"):
        kind = OmegaConf.get_type(cfg, key) if key in cfg else None
        if kind in (ClusterConfig, Pacing, Whatif, AllControllers, ReplayConfig, SimConfig):
            typed(kind, cfg[key])
    if cfg.get("guard") is not None:  # the guard checks its own values: here, before any work
        controller_factory("none", {}, cfg.guard)()
    backend = cfg.get("backend")
    schedule = exchange_schedule(cfg)
    if backend is not None and backend.get("name") == "torch" and schedule != ExchangeSchedule():
        raise ConfigError(
            f"exchange.* models a live job's exchange in replay and sim (got lag_iters={schedule.lag}, "
            f"every_iters={schedule.every}); backend=torch has the real one: set "
            "backend.pacing.gather=async (lag 1) or piggyback (lag 2) and backend.pacing.gather_every instead"
        )
    analysis = cfg.get("analysis")
    replay = backend is None or backend.get("name") == "replay"
    if analysis is not None and analysis.get("name") == "whatif" and not replay:
        raise ConfigError(
            f"analysis=whatif analyses a recorded trace, so it needs backend=replay (the default), got "
            f"backend={backend.get('name')}. Record the run first (backend.record=true for sim; always "
            "for torch), then: python -m pacectl.run analysis=whatif trace=canonical trace.path=<record>"
        )
    trace = cfg.get("trace")
    if isinstance(trace, DictConfig) and replay:
        trace_config(trace, check_only=True)  # its ranges, before any work


def _check_known_keys(cfg: DictConfig) -> None:
    """Reject keys a typed config does not have (``+key=`` additions nothing reads): at the top level
    and in every typed section (the torch backend checks its own, nested keys).

    Raises:
        ConfigError: naming the unknown keys, the known ones and the override that removes them.
    """
    types = [("", OmegaConf.get_type(cfg))] + [(str(k), OmegaConf.get_type(cfg, str(k))) for k in cfg]
    for group, kind in types:
        node = cfg.get(group) if group else cfg
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind) and isinstance(node, DictConfig)):
            continue
        known = {f.name for f in dataclasses.fields(kind)}
        unknown = sorted(set(map(str, node.keys())) - known)
        if unknown and group:
            raise unknown_keys_error(group, node, known)
        if unknown:
            hints = "".join(f"; did you mean {h!r}?" for h in (did_you_mean(k, known) for k in unknown) if h)
            raise ConfigError(f"top-level keys must be among {sorted(known)}, got unknown {unknown}{hints}")


def exchange_schedule(cfg: DictConfig) -> ExchangeSchedule:
    """The run's :class:`~pacectl.loop.ExchangeSchedule` from ``exchange`` (:class:`Exchange`).

    Raises:
        ConfigError: a value that is not an integer >= 1.
    """
    exchange = typed(Exchange, cfg.get("exchange"))
    return ExchangeSchedule(lag=exchange.lag_iters, every=exchange.every_iters)
