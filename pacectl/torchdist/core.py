"""The torch-free core of the live backend: observations from gathered waits, decisions, schedules, records.

Everything here is pure numpy (no torch, no clock, no I/O except :class:`ControlWatcher`), so it is
unit-tested without processes and every rank of a job computes bit-identical results from the same
gathered table.

Arrival skew without synchronized clocks: all ranks leave a blocking
collective together, so the time a rank spent inside it, ``in_collective_i = exit_i - enter_i``
(local clock), is its wait for the last rank plus the common transfer time. Hence

- ``wait_i = in_collective_i - min_j in_collective_j`` (how early rank ``i`` was);
- the last rank ``L = argmin in_collective`` waited for nobody, and its own arrival measured from the
  iteration start (the previous iteration's common exit, also a local-clock difference) anchors the
  others: ``arrival_i = arrival_local_L - wait_i``;
- ``collective_time_s = in_collective_L`` (transfer after the last arrival).

Only local-clock differences are ever exchanged.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from pacectl.checks import Checked, Range, flag, within
from pacectl.controllers import PacingGuardWarning, SafetyGuard, fill_schedule, make_controller
from pacectl.errors import ConfigError, PacectlError, config_error
from pacectl.traces.model import JobMeta, OpTrace, validate_ops
from pacectl.types import Action, Episode, FloatArray, Observation

#: Exit code of a rank that ``backend.fault`` stops on purpose (tests of the dead-rank path).
FAULT_EXIT_CODE = 17


#: Error text of a rank that failed because a peer did (dead connection, collective timeout).
_PEER_ERROR_MARKS = (
    "by peer",
    "connection closed",
    "connection reset",
    "timed out",
    "timeout",
    "broken pipe",
)


def is_peer_error(text: str) -> bool:
    """Whether an error message only reports a lost peer or a collective timeout."""
    lowered = text.lower()
    return any(m in lowered for m in _PEER_ERROR_MARKS)


#: Per-rank figures exchanged once per iteration (one float64 each), in this order; see
#: :mod:`pacectl.torchdist.pacer` for the three ways.
GATHER_FIELDS = (
    "arrival_local_s",  # enter of the paced collective minus the iteration start, local clock
    "in_collective_s",  # exit minus enter of the paced collective, local clock
    "applied_delay_s",  # pacing delay this rank applied before entering
    "backward_end_s",  # end of the iteration's gradient sync minus the iteration start
    "control_version",  # runtime-control version rank 0 has published (other ranks: 0)
)
NUM_GATHER_FIELDS = len(GATHER_FIELDS)
#: Column of each field in an exchanged table (``table[:, COLUMN["in_collective_s"]]``).
COLUMN = {name: i for i, name in enumerate(GATHER_FIELDS)}


def gather_row(**figures: float) -> list[float]:
    """This rank's figures of one iteration in :data:`GATHER_FIELDS` order (each field by name).

    Raises:
        TypeError: a field missing or unknown.
    """
    if set(figures) != set(GATHER_FIELDS):
        raise TypeError(f"gather_row needs exactly {GATHER_FIELDS}, got {sorted(figures)}")
    return [float(figures[name]) for name in GATHER_FIELDS]


#: Ways to exchange the per-rank figures (see :mod:`pacectl.torchdist.pacer`); ``auto`` is
#: :func:`resolve_gather`'s choice per process-group backend.
GATHER_MODES = ("auto", "piggyback", "async", "collective")


#: The process-group backend of the built-in job (``python -m pacectl.run backend=torch``); a
#: :class:`~pacectl.torchdist.pacer.Pacer` resolves ``gather=auto`` from its own process group.
BUILTIN_DIST_BACKEND = "gloo"


def resolve_gather(mode: str, dist_backend: str) -> str:
    """The exchange a ``gather`` mode means on a process-group backend: ``auto`` is ``piggyback``
    on NCCL and ``async`` otherwise (gloo); other modes are themselves.

    Why: on CPU/gloo both cost the same wall time with a core per rank, ``async`` takes less hook
    CPU, and its decisions are one iteration fresher. On CUDA the async exchange makes the host
    wait for the device twice per iteration (at the iteration's end, where it resolves the device
    times, and at the decode, which waits for the forward pass queued before it), while
    piggybacked rows are staged to the host without a sync. The measurements:
    ``experiments/staleness/README.md`` ("Why ``gather=auto``...") and
    ``experiments/gpu_check/README.md``.

    Args:
        mode: one of :data:`GATHER_MODES`.
        dist_backend: the process group's backend name (``"gloo"``, ``"nccl"``, ...).

    Returns:
        ``"piggyback"``, ``"async"`` or ``"collective"``.
    """
    if mode != "auto":
        return mode
    return "piggyback" if str(dist_backend).lower() == "nccl" else "async"


def exchange_lag(mode: str) -> int:
    """Iterations from an observation to the first one its decision paces: 2 for ``piggyback``
    (the rows ride on the next iteration's bucket), 1 for ``async`` and ``collective``."""
    return 2 if mode == "piggyback" else 1


#: Built-in workload models (see :func:`pacectl.torchdist.worker.build_model`).
WORKLOAD_MODELS = ("mlp", "transformer", "sleep")
#: ``backend.parallel``: how the built-in workload shards its gradients (DDP all-reduce or FSDP2
#: reduce-scatter on a CPU device mesh).
PARALLEL_MODES = ("ddp", "fsdp2")


@dataclass(kw_only=True)
class WorkloadConfig(Checked):
    """``backend.workload``: the built-in model on synthetic data (loss = mean(output^2)).

    ``width`` is the hidden size (mlp) or d_model (transformer, a multiple of ``heads``);
    ``seq_len`` and ``heads`` are the transformer's, ``compute_s`` the sleep model's seconds per
    iteration; ``bucket_cap_mb`` is DDP's gradient bucket size (several buckets overlap backward).
    """

    section: ClassVar[str] = "backend.workload"
    model: str = within("mlp", choices=WORKLOAD_MODELS)
    width: int = within(512, ">= 1")
    depth: int = within(4, ">= 1")
    batch_size: int = within(32, ">= 1")
    seq_len: int = within(32, ">= 1")
    heads: int = within(4, ">= 1")
    bucket_cap_mb: float = within(1.0, "> 0")
    lr: float = within(1e-3, "> 0")
    compute_s: float = within(0.0, ">= 0")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model == "transformer" and self.width % self.heads:
            raise ConfigError(
                f"backend.workload.width must be a multiple of backend.workload.heads for the transformer, "
                f"got width {self.width} and heads {self.heads}: e.g. backend.workload.heads=4"
            )


@dataclass(kw_only=True)
class StragglerSpec(Checked):
    """Injected straggling (``backend.straggler``): with probability ``prob`` per iteration, a rank
    is slowed by ``duration_s``.

    Attributes:
        rank: the slowed rank, or -1 for a random rank per event, or None for no injection.
        prob: probability per iteration, [0, 1].
        duration_s: extra time of one event, seconds, >= 0.
        kind: ``"sleep"`` (idle, like a stalled data loader) or ``"burn"`` (busy CPU, like interference).
        jitter_frac: each event lasts ``duration_s * U(1 - jitter_frac, 1 + jitter_frac)``, [0, 1].
    """

    section: ClassVar[str] = "backend.straggler"
    rank: int | None = within(1, ">= -1")
    prob: float = within(0.3, "[0, 1]")
    duration_s: float = within(0.02, ">= 0")
    kind: str = within("sleep", choices=("sleep", "burn"))
    jitter_frac: float = within(0.5, "[0, 1]")


@dataclass(kw_only=True)
class ProbeSpec(Checked):
    """Randomised probe delays (``backend.probe``): small sleeps, independent of any controller.

    On each chosen rank and iteration, with probability ``prob``, the rank sleeps ``U(0,
    max_delay_s)`` seconds between its forward and its backward, so its arrival at every gradient
    bucket's collective moves by that much, as a host pacing delay moves it. The schedule depends
    only on the experiment seed (the same probes in every controller run of a job): variation no
    controller caused, from which the response of a collective's completion to a delay can be
    estimated (``experiments/probe``). Recorded as compute in the canonical record (the first
    backward segment), and per iteration and rank in ``<record_dir>/<controller>.episode.pkl``
    (``probe_s`` as scheduled, ``probe_actual_s`` as slept).

    Attributes:
        ranks: the probed ranks, e.g. ``[0, 1, 2, 3]``; empty (the default) switches probes off.
        prob: probability per probed rank and measured iteration, [0, 1].
        max_delay_s: the largest delay, seconds, finite and >= 0.
    """

    section: ClassVar[str] = "backend.probe"
    ranks: list[int] = field(
        default_factory=list,
        metadata={"range": Range(0.0), "what": "a list of ranks (integers >= 0), e.g. [0,1]"},
    )
    prob: float = within(0.5, "[0, 1]")
    max_delay_s: float = within(0.005, ">= 0")

    @property
    def active(self) -> bool:
        """Whether any probe can fire."""
        return bool(self.ranks) and self.prob > 0.0 and self.max_delay_s > 0.0


@dataclass(kw_only=True)
class PacingConfig(Checked):
    """``backend.pacing``: the pacing layer's settings, also :class:`~pacectl.torchdist.pacer.Pacer`'s
    keyword arguments of the same names (see it for each).

    ``gather_every`` > 1 makes decisions staler (``experiments/staleness``); ``control_path``: the
    JSON file rank 0 watches (``{"enabled": false}`` or ``{"controller": {...}}``).
    """

    section: ClassVar[str] = "backend.pacing"
    spin_s: float = within(2e-4, ">= 0")
    gather: str = within("auto", choices=GATHER_MODES)
    gather_every: int = within(1, ">= 1")
    piggyback_max_bytes: int | None = within(
        None, ">= 0", what="an integer >= 0 (bytes, e.g. 1048576 = 1 MiB; null: always append to the carrier)"
    )
    control_path: str | None = None
    control_poll_iters: int = within(10, ">= 1")


@dataclass(kw_only=True)
class FaultConfig(Checked):
    """``backend.fault`` (tests): rank ``rank`` exits (``kind=exit``) or holds itself stopped
    (``stop``, SIGSTOP) at measured iteration ``iteration``; both null (the default): no fault.
    ``backend.fault="{rank: 1, iteration: 3}"`` sets both."""

    section: ClassVar[str] = "backend.fault"
    rank: int | None = within(None, ">= 0")
    iteration: int | None = within(None, ">= 0")
    kind: str = within("exit", choices=("exit", "stop"))

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.rank is None) != (self.iteration is None):
            raise ConfigError(
                f"backend.fault needs both rank and iteration (or neither: no fault), got rank {self.rank} and "
                f'iteration {self.iteration}: e.g. backend.fault="{{rank: 1, iteration: 3}}"'
            )


@dataclass(kw_only=True)
class TorchConfig(Checked):
    """``backend=torch``: a live torch.distributed job (gloo on CPU), every controller against no
    pacing on the same seed and straggler schedule; typed (Hydra's ConfigStore).

    Each run writes ``<record_dir>/<controller>.parquet`` (canonical trace; ``record_dir`` null:
    ``<run dir>/records``), replayable with ``trace=canonical trace.path=<that file>``::

        python -m pacectl.run backend=torch backend.nproc_per_node=4
        python -m pacectl.run backend=torch controller=threshold backend.straggler.kind=burn

    ``nproc_per_node`` ranks are started by torch's elastic launcher (c10d rendezvous on
    127.0.0.1, ``start_method`` spawn or fork). The runs train in turn, ``interleave_block``
    iterations each (machine drift spreads over all of them; 0: one run after the other), after
    ``warmup_iterations`` unpaced, unlogged ones (DDP rebuilds its buckets after iteration 0).
    ``pg_timeout_s``: a dead rank ends the job within this. ``socket_ifname``: GLOO_SOCKET_IFNAME;
    ``threads``: torch intra-op threads per rank. ``parallel``: ``ddp`` (all-reduce buckets) or
    ``fsdp2`` (fully_shard per layer on a CPU device mesh, paced at the forward's first all-gather).
    ``flight_recorder``: PyTorch's Flight Recorder on, each run's dump in
    ``<record_dir>/flight_recorder/<controller>/`` (replay: ``trace=<that folder>``). ``comm_model``
    labels the real fabric (timing-dependent: pacing may help or hurt).
    """

    section: ClassVar[str] = "backend"
    name: str = "torch"
    comm_model: str = "live-gloo"
    nproc_per_node: int = within(4, ">= 1")
    num_iterations: int = within(60, ">= 2")
    interleave_block: int = within(10, ">= 0")
    warmup_iterations: int = within(5, ">= 0")
    pg_timeout_s: float = within(30.0, "> 0")
    start_method: str = within("spawn", choices=("spawn", "fork"))
    socket_ifname: str = "lo"
    threads: int = within(1, ">= 1")
    record_dir: str | None = None
    parallel: str = within("ddp", choices=PARALLEL_MODES)
    flight_recorder: Any = flag(False)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    straggler: StragglerSpec = field(default_factory=StragglerSpec)
    probe: ProbeSpec = field(default_factory=ProbeSpec)
    pacing: PacingConfig = field(default_factory=PacingConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        nproc, ranks = self.nproc_per_node, f"backend.nproc_per_node={self.nproc_per_node}"
        for ok, message in (
            (
                self.comm_model.startswith("live-"),
                "backend.comm_model labels the real fabric of a live run and must start with 'live-', "
                f"got {self.comm_model!r}: e.g. backend.comm_model=live-gloo",
            ),
            (
                not self.flight_recorder or self.warmup_iterations >= 1,
                "backend.flight_recorder=true needs backend.warmup_iterations >= 1, got 0: DDP rebuilds its "
                "buckets after the first iteration, so the recorded steps match the record only after it",
            ),
            (
                not (self.parallel == "fsdp2" and self.pacing.gather == "piggyback"),
                "backend.pacing.gather=piggyback rides on a gradient all-reduce, and backend.parallel=fsdp2 "
                "reduce-scatters its gradients: use backend.pacing.gather=async (the default on gloo) or collective",
            ),
            (
                self.straggler.rank is None or self.straggler.rank < nproc,
                f"backend.straggler.rank must be in [-1, {nproc}) ({ranks}) or null, got {self.straggler.rank!r}: "
                "pick a rank that exists, or backend.straggler.rank=null for no straggler",
            ),
            (
                all(r < nproc for r in self.probe.ranks),
                f"backend.probe.ranks must be ranks in [0, {nproc}) ({ranks}), got {self.probe.ranks!r}: pick "
                "ranks that exist, or backend.probe.ranks=[] for no probes",
            ),
        ):
            if not ok:
                raise ConfigError(message)
        fault = self.fault
        if fault.rank is not None and fault.rank >= nproc:
            raise ConfigError(f"backend.fault.rank must be < {ranks}, got {fault.rank}")
        if fault.iteration is not None and fault.iteration >= self.num_iterations:
            raise ConfigError(
                f"backend.fault.iteration must be < backend.num_iterations={self.num_iterations} (a measured "
                f"iteration, counted from 0 after the warm-up), got {fault.iteration}: the fault would never happen"
            )


def check_pacing(
    settings: PacingConfig, *, dist_backend: str = BUILTIN_DIST_BACKEND, warn: bool = True
) -> PacingConfig:
    """What :class:`PacingConfig`'s own checks cannot see: the ``control_path`` on this machine, and
    settings that do not combine (warned about).

    Args:
        settings: the checked settings (``backend.pacing``, or a Pacer's keyword arguments).
        dist_backend: the process group's backend, to resolve ``gather=auto``.
        warn: give the warnings below (a pacer passes True on rank 0 only: one copy per job, from
            the rank that reads the control file).

    Returns:
        ``settings``.

    Raises:
        ConfigError: ``control_path`` is not a path, or names a folder.

    Warns:
        UserWarning: ``piggyback_max_bytes`` with an exchange other than piggyback (ignored), or a
            ``control_path`` whose folder does not exist.
    """
    key = settings.where("control_path")[0]
    limit, gather, control = settings.piggyback_max_bytes, settings.gather, settings.control_path
    resolved = resolve_gather(gather, dist_backend)
    if warn and limit is not None and resolved != "piggyback":
        on = f" ({resolved} on {dist_backend})" if gather == "auto" else ""
        warnings.warn(
            f"{key.removesuffix('control_path')}piggyback_max_bytes={limit} applies to gather=piggyback only; "
            f"gather={gather}{on} ignores it",
            UserWarning,
            stacklevel=3,
        )
    if control is not None and not isinstance(control, (str, Path)):
        raise ConfigError(f"{key} must be a file path or null, got {control!r}")
    if control is not None and Path(control).expanduser().is_dir():
        raise ConfigError(
            f"{key}={control} is a folder: it names the JSON file rank 0 watches "
            f"(e.g. {key}={Path(control) / 'pacing.json'})"
        )
    if warn and control is not None and not Path(control).expanduser().parent.is_dir():
        warnings.warn(
            f"{key}={control}: its folder does not exist (yet), so no control message can appear there "
            "until it is created; check the path",
            UserWarning,
            stacklevel=3,
        )
    return settings


def torch_config(node: Mapping[str, Any]) -> TorchConfig:
    """The checked :class:`TorchConfig` of a ``backend`` config (composed by Hydra, or a plain
    mapping), before any rank starts; the pacing settings' warnings given (:func:`check_pacing`).

    Raises:
        ConfigError: naming the key, what it must be and the fix, for an unknown key or a wrong type,
            range or choice (the ranks would otherwise fail one by one after the launch), or a
            ``socket_ifname`` this machine does not have.
    """
    import socket

    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    typed = OmegaConf.structured(TorchConfig)
    try:
        for key, value in node.items():  # one key at a time: an error names it
            if isinstance(value, Mapping):
                typed.merge_with({key: value})
            else:
                typed[key] = value
        settings = OmegaConf.to_object(typed)
    except OmegaConfBaseException as err:
        raise ConfigError(config_error(err, "backend")) from None
    assert isinstance(settings, TorchConfig)
    check_pacing(settings.pacing)
    try:
        if settings.socket_ifname:
            socket.if_nametoindex(settings.socket_ifname)
    except OSError:
        raise ConfigError(
            f"backend.socket_ifname names no network interface of this machine, got {settings.socket_ifname!r} "
            "(lo is the loopback; `ip link` lists the others)"
        ) from None
    return settings


def observation_from_table(iteration: int, table: FloatArray) -> Observation:
    """Build the observation of one iteration from the gathered per-rank figures.

    Args:
        iteration: 0-based iteration index.
        table: ``float64[num_ranks, NUM_GATHER_FIELDS]``, columns :data:`GATHER_FIELDS`, seconds.

    Returns:
        The :class:`~pacectl.types.Observation` of the one pacing domain (the whole world, pure DP),
        by the module docstring's formulas; ``iteration_time_s`` is the latest ``backward_end_s``.
    """
    arrival_local = table[:, COLUMN["arrival_local_s"]]
    in_coll = table[:, COLUMN["in_collective_s"]]
    delay = table[:, COLUMN["applied_delay_s"]]
    last = int(np.argmin(in_coll))
    wait = in_coll - in_coll[last]
    arrival = arrival_local[last] - wait
    return Observation(
        iteration=iteration,
        domain=0,
        arrival_s=arrival,
        applied_delay_s=delay.copy(),
        natural_arrival_s=arrival - delay,
        wait_s=wait,
        iteration_time_s=float(table[:, COLUMN["backward_end_s"]].max()),
        collective_time_s=float(in_coll[last]),
    )


def one_hot_row(rank: int, world_size: int, values: Sequence[float]) -> FloatArray:
    """This rank's slot of the gather buffer: zeros except row ``rank``.

    A sum all-reduce of these buffers is an exact all-gather (``x + 0 = x`` in any order), so every
    rank receives the bit-identical table.

    Returns:
        ``float64[world_size * NUM_GATHER_FIELDS]``.
    """
    buf = np.zeros((world_size, NUM_GATHER_FIELDS), dtype=np.float64)
    buf[rank] = values
    return buf.reshape(-1)


class DecisionEngine:
    """The guarded controller every rank runs on identical inputs, plus runtime retuning.

    Args:
        family: controller family (``"none"``, ``"threshold"``, ...).
        params: its constructor parameters.
        guard: :class:`~pacectl.controllers.SafetyGuard` keyword arguments.
        num_ranks: ranks of the pacing domain (the world).
        seed: seeds the controller's ``rng`` (``default_rng([seed, 0])``), identical on every rank.
        schedule: the exchange's ``(lag, every)``, which the forecast controller's ``horizon_iters`` /
            ``hold_iters`` take when ``auto`` or missing, here and in runtime controls;
            :class:`~pacectl.torchdist.pacer.Pacer` sets it from its resolved ``gather`` and
            ``gather_every`` (:meth:`set_schedule`).

    Raises:
        ConfigError: bad family, parameter or guard value.
    """

    def __init__(
        self,
        family: str,
        params: Mapping[str, Any],
        guard: Mapping[str, Any],
        *,
        num_ranks: int,
        seed: int,
        schedule: tuple[int, int] = (1, 1),
    ) -> None:
        self.family = family
        self.params = dict(params)
        self.schedule = schedule
        self.guard_params = dict(guard)
        self.num_ranks = num_ranks
        self.seed = seed
        self.version = 0
        self.controller = self._build(self.family, self.params, self.guard_params, version=0)

    def _build(
        self, family: str, params: Mapping[str, Any], guard: Mapping[str, Any], *, version: int
    ) -> SafetyGuard:
        resolved = fill_schedule(family, dict(params), *self.schedule)
        ctrl = SafetyGuard(make_controller(family, **resolved), **guard)
        ctrl.reset(self.num_ranks, np.random.default_rng([self.seed, 0, version]))
        return ctrl

    def set_schedule(self, lag: int, every: int) -> None:
        """Set the exchange's ``(lag, every)``; rebuild (and reset) the controller if it depends on it.

        Call it before the first decision (the :class:`~pacectl.torchdist.pacer.Pacer` does).
        """
        old, self.schedule = self.schedule, (int(lag), int(every))
        if fill_schedule(self.family, dict(self.params), *old) != fill_schedule(
            self.family, dict(self.params), *self.schedule
        ):
            enabled = self.controller.enabled
            self.controller = self._build(self.family, self.params, self.guard_params, version=self.version)
            self.controller.enabled = enabled

    @property
    def name(self) -> str:
        """Family name of the controller in force."""
        return self.controller.name

    def decide(self, obs: Observation) -> Action:
        """Guarded delays for the next iteration (zero delay plus a warning on any failure)."""
        return self.controller.act(obs)

    def diagnostics(self) -> dict[str, float]:
        """The guarded controller's diagnostics."""
        return self.controller.diagnostics()

    def apply_control(self, control: Mapping[str, Any], version: int) -> bool:
        """Apply a runtime control message (see :func:`validate_control`) at the same iteration on every rank.

        ``enabled`` toggles the guard's kill switch and keeps the controller's state; a new
        ``controller`` or ``guard`` rebuilds and resets the guarded controller (seeded by ``version``).
        A message that fails to build leaves the controller unchanged and warns.

        Returns:
            Whether the message was applied (False: ignored with a warning).
        """
        self.version = int(version)
        if "controller" in control or "guard" in control:
            spec = dict(control.get("controller", {}))
            family = str(spec.pop("name", self.family))
            params = spec if "controller" in control else self.params
            guard = {**self.guard_params, **dict(control.get("guard", {}))}
            try:
                rebuilt = self._build(family, params, guard, version=self.version)
            except (PacectlError, TypeError, ValueError) as err:
                warnings.warn(f"pacing control v{version} ignored: {err}", PacingGuardWarning, stacklevel=2)
                return False
            enabled = self.controller.enabled
            self.family, self.params, self.guard_params, self.controller = family, params, guard, rebuilt
            self.controller.enabled = enabled
        if "enabled" in control:
            self.controller.enabled = bool(control["enabled"])
        return True


@dataclass(kw_only=True)
class ControlMessage(Checked):
    """A runtime control message (the JSON file ``backend.pacing.control_path``), every key optional:
    ``enabled`` (true or false: the guard's kill switch), ``controller`` (a controller config:
    ``name`` plus parameters, as in ``controller=<family>``; without ``name``, the running
    family's), ``guard`` (SafetyGuard keyword arguments). A key set to null is left as it is."""

    enabled: Any = flag(None)
    controller: dict[str, Any] | None = None
    guard: dict[str, Any] | None = None

    def where(self, key: str) -> tuple[str, str]:
        return key, ""  # a key of the file, not an override: validate_control says which file


def validate_control(control: Any, *, source: str, family: str | None = None) -> dict[str, Any]:
    """Check a runtime control message (:class:`ControlMessage`), and that its controller builds.

    Raises:
        ConfigError: not a mapping, an unknown key, a wrong type, or a controller that does not
            build, naming the file's key and ``source``.
    """
    from pacectl.checks import typed

    if not isinstance(control, dict):
        raise ConfigError(f"pacing control must be a JSON object, got {control!r} (in {source})")
    try:
        typed(ControlMessage, control)
        control = {k: v for k, v in control.items() if v is not None}  # null: left as it is
    except ConfigError as err:
        raise ConfigError(
            f"pacing control: {str(err).partition(': for example')[0]} (in {source}); for example "
            '{"enabled": false}, {"controller": {"name": "pid", "kp": 0.2}} or {"guard": {"max_delay_frac": 0.3}}'
        ) from None
    spec = dict(control.get("controller", {}))
    name = spec.pop("name", family)
    if name is None and spec:
        raise ConfigError(
            f"pacing control 'controller' must name its family here, e.g. "
            f'{{"controller": {{"name": "pid", "kp": 0.2}}}}, got {control["controller"]!r} (in {source})'
        )
    try:
        fill_schedule(str(name), spec, 1, 1)  # "auto" or missing: the job's exchange, applied by the engine
        inner = make_controller(str(name), **spec) if name is not None else make_controller("none")
        SafetyGuard(inner, **dict(control.get("guard", {})))
    except TypeError as err:
        raise ConfigError(f"pacing control has an unknown parameter: {err} (in {source})") from err
    except ConfigError as err:
        # the parameter checks name command-line overrides; here the value came from this file
        text = re.sub(
            r"override: (controller|guard)\.(\w+)=<value>", r'key "\2" of "\1" in this file', str(err)
        )
        raise ConfigError(f"pacing control: {text} (in {source})") from err
    return dict(control)


class ControlWatcher:
    """Watch a JSON file for runtime pacing control (rank 0 only; decisions stay identical, see Pacer).

    Args:
        path: the file; it need not exist yet. Edit it atomically (write a temp file, then rename).
        family: returns the running controller family, which a ``controller`` section without
            ``name`` retunes (None: such a section must name its family).

    Example:
        ``echo '{"enabled": false}' > ctl.tmp && mv ctl.tmp ctl.json`` switches pacing off.
    """

    def __init__(self, path: str | Path, family: Callable[[], str] | None = None) -> None:
        self.path = Path(path)
        self.family = family
        self._stamp: tuple[int, int] | None = None  # a file present at start is applied at the first poll
        #: every version of the file that was ignored, in order: ``{"error": why}``
        self.rejected: list[dict[str, Any]] = []

    def poll(self) -> dict[str, Any] | None:
        """A new valid control message if the file changed since the last poll, else None (warns if invalid)."""
        try:
            st = self.path.stat()
        except OSError:  # not there (yet)
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            family = self.family() if self.family is not None else None
            return validate_control(json.loads(self.path.read_text()), source=str(self.path), family=family)
        except (OSError, ValueError) as err:
            where = "" if str(self.path) in str(err) else f" {self.path}"
            warnings.warn(f"pacing control file{where} ignored: {err}", PacingGuardWarning, stacklevel=2)
            self.rejected.append({"error": str(err)})
            return None


def straggler_schedule(spec: StragglerSpec, *, num_iterations: int, world_size: int, seed: int) -> FloatArray:
    """The injected extra time per iteration and rank: identical for every controller run of a seed.

    Args:
        spec: what to inject.
        num_iterations: iterations (warm-up included).
        world_size: ranks.
        seed: experiment seed (the schedule uses ``default_rng([seed, 5])``).

    Returns:
        ``float64[num_iterations, world_size]``, seconds.

    Raises:
        ConfigError: ``spec.rank`` outside ``[-1, world_size)``.
    """
    out = np.zeros((num_iterations, world_size), dtype=np.float64)
    if spec.rank is None or spec.prob == 0.0 or spec.duration_s == 0.0:
        return out
    if not -1 <= spec.rank < world_size:
        raise ConfigError(f"backend.straggler.rank must be in [-1, {world_size}) or null, got {spec.rank!r}")
    rng = np.random.default_rng([seed, 5])
    hit = rng.random(num_iterations) < spec.prob
    who = (
        rng.integers(0, world_size, num_iterations) if spec.rank == -1 else np.full(num_iterations, spec.rank)
    )
    scale = rng.uniform(1.0 - spec.jitter_frac, 1.0 + spec.jitter_frac, num_iterations)
    out[np.flatnonzero(hit), who[hit]] = spec.duration_s * scale[hit]
    return out


def probe_schedule(
    spec: ProbeSpec, *, num_iterations: int, world_size: int, seed: int, warmup_iterations: int = 0
) -> FloatArray:
    """The probe delay per iteration and rank: identical for every controller run of a seed.

    Args:
        spec: the probes.
        num_iterations: iterations, warm-up included.
        world_size: ranks.
        seed: experiment seed (the schedule uses ``default_rng([seed, 7])``).
        warmup_iterations: leading iterations left unprobed (unlogged warm-up).

    Returns:
        ``float64[num_iterations, world_size]``, seconds, each entry 0 or in ``(0, max_delay_s]``.

    Raises:
        ConfigError: a probed rank outside ``[0, world_size)``.
    """
    out = np.zeros((num_iterations, world_size), dtype=np.float64)
    if not spec.active:
        return out
    bad = [r for r in spec.ranks if r >= world_size]
    if bad:
        raise ConfigError(
            f"backend.probe.ranks must be ranks in [0, {world_size}), got {list(spec.ranks)!r}: "
            f"drop {bad} or start more ranks"
        )
    rng = np.random.default_rng([seed, 7])
    hit = rng.random((num_iterations, world_size)) < spec.prob
    size = spec.max_delay_s * (1.0 - rng.random((num_iterations, world_size)))  # in (0, max]
    chosen = np.zeros(world_size, dtype=bool)
    chosen[list(spec.ranks)] = True
    out[hit & chosen] = size[hit & chosen]
    out[:warmup_iterations] = 0.0
    return out


# ---------------------------------------------------------------------------------------------
# Per-iteration marks of one rank -> canonical op trace
# ---------------------------------------------------------------------------------------------
def marks_to_ops(
    *,
    step: int,
    rank: int,
    forward_end_s: float,
    hook_call_s: Sequence[float],
    hook_return_s: Sequence[float],
    enter_s: Sequence[float],
    exit_s: Sequence[float],
    backward_end_s: float,
    sync_exit_s: float,
    applied_delay_s: float,
    backward_compute_end_s: float | None = None,
    serialize_buckets: bool = False,
    decisions_before: int = 0,
    delay_blocks_compute: bool = False,
    start_clock_s: float = math.nan,
    restarted: bool = False,
) -> list[tuple[Any, ...]]:
    """The canonical op rows of one rank in one iteration (times from the aligned iteration start).

    Ops (see :mod:`pacectl.traces.model`):

    - ``forward-compute`` 0: ``[0, forward_end)``: optimizer step of the previous iteration, data,
      injected straggling and the forward pass (everything before backward);
    - ``backward-compute`` j: the backward segment before bucket j's hook (j = 0..B-1) and the tail
      after the last hook (j = B), until ``backward_compute_end_s`` (None: ``backward_end_s``, when
      the tail also holds the wait for the buckets to finish);
    - ``grads-reduce-scatter`` j: bucket j's all-reduce, ``[enter_j, exit_j)``;
      ``delay_s`` on bucket 0 = the applied pacing delay, 0 elsewhere. The replay infers from
      these stamps whether buckets ran one after the other (NCCL's one stream) or overlapped (gloo's
      two worker threads: a later bucket can finish first). ``serialize_buckets`` instead starts
      each at ``max(enter_j, exit_{j-1})``;
    - ``optimizer-clip-main-grad`` 0: the end-of-sync bookkeeping ``[backward_end, sync_exit)``
      (the exchange's host part, :mod:`pacectl.torchdist.pacer`); its exit is the next
      iteration's start.

    On CPU/gloo the pacing sleep blocks the training thread, so it also sits in the gap between
    ``backward-compute`` 0 and 1: with ``delay_blocks_compute`` that op carries the applied delay in
    ``delay_s`` too, and the trace is marked ``pacing_blocks_compute`` (:func:`rows_to_trace`), so the
    replay takes the sleep out of zero-delay counterfactuals and puts a controller's delay there.

    Returns:
        Rows ``(step, dp_rank, stage, rank, optype, seq_id, mc, start_ts, duration, delay_s)``.
        ``decisions_before``, ``start_clock_s`` and ``restarted`` (bookkeeping in the marks) are
        accepted and ignored here.
    """
    rows: list[tuple[Any, ...]] = []

    def add(optype: str, seq: int, start: float, end: float, delay: float = 0.0, mc: int = 0) -> None:
        start = max(start, 0.0)
        rows.append((step, rank, 0, rank, optype, seq, mc, start, max(end - start, 0.0), delay))

    add("forward-compute", 0, 0.0, forward_end_s)
    seg_start = forward_end_s
    prev_exit = 0.0
    for j, (call, ret, enter, exit_) in enumerate(
        zip(hook_call_s, hook_return_s, enter_s, exit_s, strict=True)
    ):
        add(
            "backward-compute",
            j,
            seg_start,
            call,
            applied_delay_s if j == 1 and delay_blocks_compute else 0.0,
        )
        start = enter if j == 0 or not serialize_buckets else max(enter, prev_exit)
        add("grads-reduce-scatter", j, start, exit_, applied_delay_s if j == 0 else 0.0, mc=-1)
        seg_start, prev_exit = ret, exit_
    tail_blocked = delay_blocks_compute and len(enter_s) == 1
    tail_end = backward_end_s if backward_compute_end_s is None else backward_compute_end_s
    add("backward-compute", len(enter_s), seg_start, tail_end, applied_delay_s if tail_blocked else 0.0)
    add("optimizer-clip-main-grad", 0, backward_end_s, sync_exit_s, mc=-1)
    return rows


_ROW_COLUMNS = (
    "step",
    "dp_rank",
    "stage",
    "rank",
    "optype",
    "seq_id",
    "mc",
    "start_ts",
    "duration",
    "delay_s",
)


def rows_to_trace(
    rows: Sequence[tuple[Any, ...]],
    *,
    world_size: int,
    name: str,
    source: str,
    pacing_blocks_compute: bool = False,
    step_time_s: Sequence[float] | None = None,
) -> OpTrace:
    """Validate the op rows of every rank as an :class:`~pacectl.traces.model.OpTrace` (dp_size = world).

    Steps whose bucket count differs from the most common one (DDP rebuilds its buckets after
    iteration 0) are dropped so that every step has the same structure. ``step_time_s`` (the live
    iteration times, indexed by step id; :func:`common_periods`) becomes the trace's
    ``measured_step_time_s`` for the steps kept.

    Raises:
        TraceError: the rows do not form a valid trace.
    """
    ops = pd.DataFrame(list(rows), columns=list(_ROW_COLUMNS))
    buckets = ops[ops["optype"] == "grads-reduce-scatter"].groupby(["step", "rank"]).size()
    per_step = buckets.groupby(level="step").agg(["min", "max"])
    mode = int(buckets.mode().iloc[0]) if len(buckets) else 0
    keep = per_step.index[(per_step["min"] == mode) & (per_step["max"] == mode)]
    ops = ops[ops["step"].isin(keep)]
    meta = JobMeta(name=name, dp_size=world_size, pp_size=1, world_size=world_size)
    return OpTrace(
        ops=validate_ops(ops, meta, source=source),
        meta=meta,
        source=source,
        fmt="torch-live",
        pacing_blocks_compute=pacing_blocks_compute,
        collective="DDP gradient all-reduce",
        measured_step_time_s=None
        if step_time_s is None
        else tuple(float(step_time_s[int(k)]) for k in sorted(keep)),
    )


def common_periods(marks_by_rank: Sequence[Sequence[Mapping[str, Any]]]) -> FloatArray:
    """The iteration periods of a live run: per iteration, the mean over ranks of each rank's own period.

    Every rank leaves the iteration's last collective at the same moment, but stamps that exit when
    its thread gets a core, so one rank's period (``sync_exit_s``) carries stamp jitter on a busy
    host. The largest of the ranks' periods is biased up by it; their mean is not: summed over
    iterations each rank's periods telescope to the same wall time, and so does their mean.

    Args:
        marks_by_rank: per rank, its :attr:`~pacectl.torchdist.pacer.Pacer.marks` (same iterations).

    Returns:
        ``float64[num_iterations]`` seconds.

    Raises:
        ValueError: the ranks logged different numbers of iterations.
    """
    table = [[float(m["sync_exit_s"]) for m in marks] for marks in marks_by_rank]
    if len({len(row) for row in table}) > 1:
        raise ValueError(f"ranks logged different numbers of iterations: {[len(row) for row in table]}")
    return np.asarray(table, dtype=np.float64).mean(axis=0)


def shared_clock_marks(
    marks_by_rank: Sequence[Sequence[Mapping[str, Any]]],
) -> tuple[list[list[dict[str, Any]]], FloatArray]:
    """Put the marks of ranks that share one clock (one host) on a common time axis per iteration.

    Each rank's marks count from its own iteration start, the moment *it* stamped the previous
    iteration's exit. The ranks leave the last gradient collective together, but each stamps that
    exit when its thread next gets a core: on a busy host milliseconds apart, a lag that per-rank
    clocks mix into every cross-rank comparison. With a clock shared by every rank
    (``start_clock_s``: ``time.perf_counter``, system-wide on one host) the lag can be placed:

    - a bucket's all-reduce completes at one instant on every rank, and every rank's stamp of it is
      late by a lag >= 0: its exit becomes the earliest stamp over ranks, on every rank;
    - ``T_k`` = the completion of the iteration's last bucket;
    - iteration ``k`` spans ``[T_{k-1}, T_k)`` (from the earliest start instead when its clock was
      restarted by :meth:`~pacectl.torchdist.pacer.Pacer.align`, or when it is the first);
    - each rank's marks move to that origin, so its lag after ``T_{k-1}`` becomes part of its
      ``forward-compute`` 0 (its own work, as it is), and its tail after ``T_k`` (waking up, the
      end-of-backward bookkeeping) moves to the next iteration: ``backward_end_s`` and
      ``sync_exit_s`` are ``T_k`` for every rank, and ``backward_compute_end_s`` (new) ends the
      backward compute at the last bucket's hook, so that the wait for the buckets is not taken
      for compute.

    A zero-delay replay then reproduces every stamp, and the periods ``T_k - T_{k-1}`` sum to the
    wall time between the first start and the last common exit.

    Args:
        marks_by_rank: per rank, its :attr:`~pacectl.torchdist.pacer.Pacer.marks` (same iterations,
            with ``start_clock_s`` and ``restarted``), all from one host.

    Returns:
        ``(marks_by_rank, periods_s)``: the marks on the common axis (new dicts), and
        ``float64[num_iterations]`` the iteration periods, seconds.

    Raises:
        ValueError: the ranks logged different numbers of iterations, or disagree on which
            iterations were restarted.
    """
    lengths = {len(marks) for marks in marks_by_rank}
    if len(lengths) > 1:
        raise ValueError(f"ranks logged different numbers of iterations: {[len(m) for m in marks_by_rank]}")
    n = lengths.pop() if lengths else 0
    restarted = np.array([[bool(m["restarted"]) for m in marks] for marks in marks_by_rank]).reshape(-1, n)
    if (restarted != restarted[:1]).any():
        raise ValueError("ranks disagree on which iterations were restarted by align()")
    start = np.array([[float(m["start_clock_s"]) for m in marks] for marks in marks_by_rank]).reshape(-1, n)
    # Bucket j's all-reduce completes at one instant on every rank; each rank's stamp of it is late.
    exits: list[FloatArray] = []  # per iteration: float64[buckets], the common completions (host clock)
    for k in range(n):
        per_rank = [
            start[r, k] + np.asarray(marks[k]["exit_s"], dtype=np.float64)
            for r, marks in enumerate(marks_by_rank)
        ]
        if len({len(e) for e in per_rank}) > 1:
            raise ValueError(f"ranks logged different numbers of buckets in iteration {k}")
        exits.append(np.min(per_rank, axis=0) if per_rank and len(per_rank[0]) else np.zeros(0))
    backward_end = np.array([[float(m["backward_end_s"]) for m in marks] for marks in marks_by_rank]).reshape(
        -1, n
    )
    common_exit = np.array(
        [e.max() if len(e) else (start[:, k] + backward_end[:, k]).min() for k, e in enumerate(exits)]
    )
    origin = start.min(axis=0)
    chained = ~restarted[0]
    chained[:1] = False
    origin[chained] = common_exit[np.flatnonzero(chained) - 1]
    periods = common_exit - origin
    out: list[list[dict[str, Any]]] = []
    for r, marks in enumerate(marks_by_rank):
        rows = []
        for k, m in enumerate(marks):
            shift = max(start[r, k] - origin[k], 0.0)
            row = dict(m)
            row["forward_end_s"] = float(m["forward_end_s"]) + shift
            for key in ("hook_call_s", "enter_s"):
                row[key] = [float(t) + shift for t in m[key]]
            # A hook that returns after the iteration's last completion T_k returned late because
            # its thread lost the core after issuing the all-reduce (a busy host): that lag is
            # after T_k, so it belongs to the next iteration (whose start it delays), not to this
            # one's backward compute, which the optimizer bookkeeping at T_k would then precede.
            row["hook_return_s"] = [min(float(t) + shift, float(periods[k])) for t in m["hook_return_s"]]
            row["exit_s"] = (exits[k] - origin[k]).tolist()
            # No autograd work is left after the last bucket's hook (it fires once the first
            # layer's gradients are in); what follows on this rank is the wait for the buckets.
            row["backward_compute_end_s"] = (
                row["hook_return_s"][-1]
                if m["hook_return_s"]
                else min(row["forward_end_s"], float(periods[k]))
            )
            row["backward_end_s"] = row["sync_exit_s"] = float(periods[k])
            rows.append(row)
        out.append(rows)
    return out, periods


def _step_errors(replayed: FloatArray, live: FloatArray) -> dict[str, float]:
    """Median, p90 and max over steps of ``|replayed - live| / live`` (``step_time_*_abs_err_frac``)."""
    err = np.abs(replayed - live) / live
    return {
        "step_time_median_abs_err_frac": float(np.median(err)),
        "step_time_p90_abs_err_frac": float(np.percentile(err, 90)),
        "step_time_max_abs_err_frac": float(err.max()),
    }


def replay_fidelity(trace: OpTrace, live_step_time_s: FloatArray | None = None) -> dict[str, float]:
    """Replay a live record with its own recorded pacing delays; compare step times with the live ones.

    Args:
        trace: a record written by a live run (``delay_s`` on ``grads-reduce-scatter`` 0).
        live_step_time_s: ``float64[num_steps]`` the live run's iteration times of the record's steps
            (:func:`common_periods`), seconds; None: those the record carries
            (:meth:`~pacectl.traces.model.OpTrace.reference_step_time_s`).

    Returns:
        ``step_time_median_abs_err_frac``, ``step_time_p90_abs_err_frac``,
        ``step_time_max_abs_err_frac`` (|replayed - live| / live over steps), ``launch_clipped``,
        ``transfer_clipped`` (clipped estimates, see :func:`pacectl.backends.dag.estimate_intrinsic`),
        ``num_op_instances``, ``num_steps``.
    """
    from pacectl.backends.replay import ReplayBackend

    backend = ReplayBackend(trace)
    delays = recorded_delays(trace)
    _, end = backend.replayed_times(delays)
    replayed = end.max(axis=(0, 2))
    if live_step_time_s is None:
        live = trace.reference_step_time_s().to_numpy()
    else:
        live = np.asarray(live_step_time_s, dtype=np.float64)
        if live.shape != replayed.shape:
            raise ValueError(f"live_step_time_s must have shape {replayed.shape}, got {live.shape}")
    counts = backend.clip_counts
    return {
        **_step_errors(replayed, live),
        **{key: int(counts[key]) for key in ("launch_clipped", "transfer_clipped", "num_op_instances")},
        "num_steps": int(len(live)),
    }


def recorded_delays(trace: OpTrace) -> FloatArray:
    """Pacing delay recorded before bucket 0, ``float64[num_steps, world_size]`` seconds."""
    ops = trace.ops
    paced = ops[(ops["optype"] == "grads-reduce-scatter") & (ops["seq_id"] == 0)]
    col = paced["delay_s"] if "delay_s" in paced.columns else pd.Series(0.0, index=paced.index)
    table = paced.assign(delay_s=col).pivot(index="step", columns="dp_rank", values="delay_s")
    return table.to_numpy(np.float64)


def counterfactual_error(
    trace: OpTrace, live_step_time_s: FloatArray, live_paced_step_time_s: FloatArray | None = None
) -> dict[str, float]:
    """Replay a paced record with zero delays and compare with a live unpaced run on the same schedule.

    Args:
        trace: a paced live record.
        live_step_time_s: ``float64[num_steps]`` live unpaced step times of the same steps, seconds.
        live_paced_step_time_s: ``float64[num_steps]`` the paced run's own live step times, seconds;
            with it the replay's predicted effect of pacing is set against the live one.

    Returns:
        Median, p90 and max of |replayed - live| / live per step (two runs: per-iteration jitter
        included), the mean step times of both and ``mean_err_frac`` (replayed mean / live mean - 1). With
        ``live_paced_step_time_s`` also ``predicted_pacing_effect_s`` (the record replayed with its
        recorded delays minus with none: what the replay says pacing cost or saved per step, a
        paired difference in which the replay's own bias cancels) and ``live_pacing_effect_s`` (the
        paced run's mean step time minus the unpaced run's: noisier, two runs).
    """
    from pacectl.backends.replay import ReplayBackend

    backend = ReplayBackend(trace)
    _, end = backend.replayed_times(None)
    replayed = end.max(axis=(0, 2))
    live = np.asarray(live_step_time_s, dtype=np.float64)[: len(replayed)]
    replayed = replayed[: len(live)]
    out = {
        **_step_errors(replayed, live),
        "replayed_mean_s": float(replayed.mean()),
        "live_mean_s": float(live.mean()),
        "mean_err_frac": float(replayed.mean() / live.mean() - 1.0),
    }
    if live_paced_step_time_s is not None:
        _, end_paced = backend.replayed_times(recorded_delays(trace))
        paced = end_paced.max(axis=(0, 2))[: len(live)]
        live_paced = np.asarray(live_paced_step_time_s, dtype=np.float64)[: len(live)]
        out["predicted_pacing_effect_s"] = float((paced - replayed).mean())
        out["live_pacing_effect_s"] = float(live_paced.mean() - live.mean())
    return out


def episode_from_log(
    *,
    controller: str,
    comm_model: str,
    observations: Sequence[Observation],
    iteration_time_s: FloatArray,
    diagnostics: Sequence[Mapping[str, float]],
    decisions_before: Sequence[int] | None = None,
    waits: Sequence[str] | None = None,
) -> Episode:
    """The columnar :class:`~pacectl.types.Episode` of a live run (one domain: the whole world).

    Args:
        controller: controller family.
        comm_model: e.g. ``"live-gloo"``.
        observations: one per iteration, as every rank saw it.
        iteration_time_s: ``float64[num_iterations]`` measured period between consecutive common
            exits of the iteration's last collective, seconds (sums to the wall time).
        diagnostics: the guarded controller's diagnostics after each decision (one per observation).
        decisions_before: per iteration, how many decisions were logged before its delay was applied
            (the last of them chose it; 0: none, the iteration ran unpaced). Row k of the episode's
            diagnostics and ``pacing_active`` is then the state that decided iteration k's delay, as in
            :func:`pacectl.loop.run_episode`, whatever the exchange lag. Without it rows are per decision.
        waits: the ``Action.wait`` of each decision (one per observation, as ``diagnostics``), for
            the episode's ``wait_asleep``; None: every rank spun.
    """
    n = len(observations)
    asleep = None if waits is None else [w == "sleep" for w in waits]
    if decisions_before is not None:
        counts = list(decisions_before)[-n:] if n else []
        diagnostics = [diagnostics[c - 1] if 0 < c <= len(diagnostics) else {"active": 0.0} for c in counts]
        if asleep is not None:
            asleep = [asleep[c - 1] if 0 < c <= len(asleep) else False for c in counts]
    world = observations[0].num_ranks if n else 0
    keys = sorted({k for d in diagnostics for k in d})
    diag = {
        k: np.array([[d.get(k, np.nan)] for d in diagnostics], dtype=np.float64).reshape(n, 1) for k in keys
    }
    active = diag.get("active", np.zeros((n, 1))) > 0.5
    counters = [diag[k][-1, 0] for k in ("guard_interventions", "guard_clipped") if k in diag and n]

    def stack(field: str, width: int = world) -> FloatArray:
        return np.array([getattr(o, field) for o in observations], dtype=np.float64).reshape(n, width)

    return Episode(
        backend="torch",
        comm_model=comm_model,
        controller=controller,
        rank_labels=np.arange(world, dtype=np.int64),
        domain_of_rank=np.zeros(world, dtype=np.int64),
        domain_names=("world",),
        step_ids=np.arange(n, dtype=np.int64),
        iteration_time_s=np.asarray(iteration_time_s, dtype=np.float64),
        arrival_s=stack("arrival_s"),
        applied_delay_s=stack("applied_delay_s"),
        natural_arrival_s=stack("natural_arrival_s"),
        wait_s=stack("wait_s"),
        collective_time_s=stack("collective_time_s", 1),
        pacing_active=active,
        diagnostics=diag,
        guard_interventions=int(sum(float(np.nansum(c)) for c in counters)),
        wait_asleep=None if asleep is None else np.array(asleep, dtype=np.bool_).reshape(-1, 1)[:n],
    )
