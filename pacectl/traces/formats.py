"""The trace formats' typed configs: the keys of ``trace=<format>``, each format with its importer.

Each format is a dataclass, stored in Hydra's ConfigStore as an option of the ``trace`` group (by
:mod:`pacectl.config`): OmegaConf refuses a wrong type or an unknown key when Hydra composes it, and
``__post_init__`` a value out of range (:mod:`pacectl.checks`), each in one line. The shipped traces
(``trace=ar``, ``st``, ``alibaba``) are presets in ``conf/trace/`` on top of these
(``defaults: [bytedance, _self_]`` and their paths). :func:`trace_config` turns a composed ``trace``
node into its dataclass; :meth:`TraceFormat.load` reads the trace.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import MISSING, DictConfig, OmegaConf

from pacectl.checks import Checked, flag, within
from pacectl.data import DATA_DIR
from pacectl.errors import ConfigError, TraceError, config_error
from pacectl.traces.model import OpTrace

_RANKS = "a list of ranks (integers >= 0), one per file in sorted path order"


def user_path(value: str, key: str = "path") -> str:
    """Resolve a user path against the directory the command was started from.

    Raises:
        ConfigError: an empty value (it would resolve to the current folder), naming ``key``.
    """
    if not str(value).strip():
        raise ConfigError(f"{key} must name a file, got an empty value")
    try:
        from hydra.utils import to_absolute_path

        return to_absolute_path(value)
    except ValueError:  # not inside a Hydra app
        return str(Path(value).expanduser().resolve())


@dataclass(kw_only=True)
class TraceFormat(Checked):
    """The keys every format has. ``path`` is one file, or (for the per-rank formats) a folder, a
    glob or a list of them; ``name`` is the job's name in the outputs (null: the format's own: the
    meta's trial_name, the files' common prefix, the folder's name); ``max_mb`` caps each file's
    size (and a JSON file's decompressed text), MiB."""

    section: ClassVar[str] = "trace"
    format: str
    path: Any = MISSING
    name: str | None = None
    max_mb: float = within(1024.0, "> 0")

    @property
    def max_bytes(self) -> int:
        """``max_mb`` in bytes."""
        return int(self.max_mb * 2**20)

    def paths(self) -> list[str]:
        """``path`` as a list of resolved paths."""
        raw = self.path
        return [user_path(str(p), "trace.path") for p in ([raw] if isinstance(raw, str) else raw)]

    def load(self) -> OpTrace:
        """Read the trace (the format's importer)."""
        raise NotImplementedError


@dataclass(kw_only=True)
class _Capped(TraceFormat):
    max_ops: int = within(4_000_000, ">= 1")  # cap on the operations (rows; ~0.2 kB of memory each)


@dataclass(kw_only=True)
class Bytedance(_Capped):
    """``trace=bytedance trace.path=<trace.parquet> trace.meta=<meta.yaml>``: a trace in the
    ByteDance what-if format (the shipped ``trace=ar`` and ``trace=st`` are presets of it)."""

    format: str = "bytedance"
    meta: str = MISSING

    def load(self) -> OpTrace:
        from pacectl.traces.bytedance import load_bytedance

        path, meta = user_path(str(self.path), "trace.path"), user_path(self.meta, "trace.meta")
        return load_bytedance(path, meta, max_ops=self.max_ops, max_bytes=self.max_bytes)


@dataclass(kw_only=True)
class Canonical(_Capped):
    """``trace=canonical trace.path=<file.parquet>``: pacectl's own trace files (written by live
    runs, the simulator and ``python -m pacectl.traces convert``)."""

    format: str = "canonical"

    def load(self) -> OpTrace:
        from pacectl.traces.canonical import load_canonical

        path = user_path(str(self.path), "trace.path")
        return load_canonical(path, max_ops=self.max_ops, max_bytes=self.max_bytes)


@dataclass(kw_only=True)
class _Timed(TraceFormat):
    # each collective's transfer time where the trace has none, s (null: collective_frac x the
    # median step time)
    collective_s: float | None = within(None, "> 0")
    collective_frac: float = within(0.01, "(0, 1)")


@dataclass(kw_only=True)
class Steplevel(_Timed, _Capped):
    """``trace=steplevel trace.path=<job_*_norm.csv>``: per-worker, per-iteration step times
    without timestamps (the Alibaba PAI mini-batch CSV, columns ``,worker,gpu,time,batch_time_norm``),
    replayed as compute followed by one collective per step (:mod:`pacectl.traces.steplevel`).
    Default: the shipped Alibaba PAI job 1 (10 workers x 300 sampled iterations, CC BY 4.0;
    ``trace=alibaba`` too)."""

    format: str = "steplevel"
    path: Any = str(DATA_DIR / "alibaba-pai" / "job_1_norm.csv")
    unit_s: float = within(1e-3, "> 0")  # seconds per unit of batch_time_norm (0-1000 per job: 1000 -> 1 s)
    sample_every: int | None = within(None, ">= 1")  # iterations between rows; null: from the time column

    def load(self) -> OpTrace:
        from pacectl.traces.steplevel import load_steplevel

        return load_steplevel(
            user_path(str(self.path), "trace.path"),
            unit_s=self.unit_s,
            collective_s=self.collective_s,
            collective_frac=self.collective_frac,
            name=self.name,
            sample_every=self.sample_every,
            max_bytes=self.max_bytes,
            max_ops=self.max_ops,
        )


@dataclass(kw_only=True)
class Kineto(TraceFormat):
    """``trace=kineto trace.path=<dir, glob or file>``: PyTorch profiler (Kineto) Chrome-trace
    JSON, one file per rank (plain or gzip), imported as pure data parallel (dp_size = number of
    files; :mod:`pacectl.traces.kineto`). Default: the shipped 4-rank gloo set recorded on one H200."""

    format: str = "kineto"
    path: Any = str(DATA_DIR / "h200-capture")
    ranks: list[int] | None = within(None, ">= 0", what=_RANKS)  # when distributedInfo.rank is missing
    world_size: int | None = within(None, ">= 1")  # overrides distributedInfo.world_size
    strict: Any = flag(False)  # true: truncated files and a subset of the world's ranks are errors
    align: str = within("auto", choices=("auto", "end", "none"))  # clock alignment on collective ends
    drop_unmatched: Any = flag(False)  # true: drop steps whose collectives do not match across ranks

    def load(self) -> OpTrace:
        from pacectl.traces.detect import other_traces_in
        from pacectl.traces.kineto import load_kineto

        paths = self.paths()
        try:
            return load_kineto(
                paths,
                ranks=self.ranks,
                world_size=self.world_size,
                strict=self.strict,
                align=self.align,
                drop_unmatched=self.drop_unmatched,
                max_bytes=self.max_bytes,
                name=self.name,
            )
        except TraceError as err:
            others = other_traces_in(paths[0]) if len(paths) == 1 else []
            if not others:
                raise
            # a folder of ByteDance / step-level files (or live records) read as Kineto: name them
            raise TraceError(
                f"{err}; the folder also holds {', '.join(others[:4])}: to replay one, name the file"
            ) from err


@dataclass(kw_only=True)
class _Layout(TraceFormat):
    # the layout, when the process groups do not tell it (rank order: TP fastest, then DP, then PP:
    # Megatron-LM's default, torchtitan's mesh ("pp", "dp", "tp"))
    dp_size: int | None = within(None, ">= 1")
    tp_size: int | None = within(None, ">= 1")
    pp_size: int | None = within(None, ">= 1")
    dp_group: str | None = None  # the description, name or id of the DP process groups, picked by hand
    collectives_per_step: int | None = within(None, ">= 1")  # when the pattern is ambiguous

    def layout(self) -> Any:
        from pacectl.traces.collectives import LayoutOverrides

        return LayoutOverrides.of(self)


@dataclass(kw_only=True)
class FlightRecorder(_Timed, _Layout, _Capped):
    """``trace=flight_recorder trace.path=<folder or glob>`` (``trace=<folder>`` works too):
    PyTorch Flight Recorder dumps, one per rank (pickle or JSON), e.g. a folder written with
    ``TORCH_FR_BUFFER_SIZE=20000 TORCH_FR_DUMP_TEMP_FILE=/dumps/fr_rank_``. Steps are inferred from
    the DP gradient collectives' pattern; compute is the gap between a rank's collectives
    (:mod:`pacectl.traces.flight_recorder`). Default: the shipped 2-rank gloo DDP dumps with an
    injected straggler."""

    format: str = "flight_recorder"
    path: Any = str(DATA_DIR / "flight-recorder" / "ddp2")
    ranks: list[int] | None = within(None, ">= 0", what=_RANKS)  # when the file names do not end in them
    # duration: duration_ms (clock-free; TORCH_NCCL_ENABLE_TIMING); created: enqueue times
    timing: str = within("auto", choices=("auto", "duration", "created"))
    # sync: the DP groups' all-gathers (FSDP's parameter all-gathers) are step collectives, so a
    # straggler before forward shows where the early ranks wait; fold: they read as compute
    all_gathers: str = within("fold", choices=("fold", "sync"))

    def load(self) -> OpTrace:
        from pacectl.traces.flight_recorder import load_flight_recorder

        return load_flight_recorder(
            self.paths(),
            ranks=self.ranks,
            max_bytes=self.max_bytes,
            max_ops=self.max_ops,  # also the cap on the entries of the set (read file by file)
            layout=self.layout(),
            timing=self.timing,
            collective_s=self.collective_s,
            collective_frac=self.collective_frac,
            name=self.name,
            all_gathers=self.all_gathers,
        )


@dataclass(kw_only=True)
class NcclInspector(_Layout):
    """``trace=nccl_inspector trace.path=<NCCL_INSPECTOR_DUMP_DIR>``: NCCL Inspector logs
    (``NCCL_PROFILER_PLUGIN=libnccl-profiler-inspector.so NCCL_INSPECTOR_ENABLE=1``;
    ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` adds the timestamps that place compute), one
    ``<host>-pid<pid>.log`` per process; earliness is clock-free (:mod:`pacectl.traces.nccl_inspector`).
    Default: shipped logs written from NCCL's documented format."""

    format: str = "nccl_inspector"
    path: Any = str(DATA_DIR / "nccl-inspector" / "verbose")
    max_mb: float = within(4096.0, "> 0")
    max_ops: int = within(4_000_000, ">= 1")  # cap on the set's collective records (~0.4 kB each)

    def load(self) -> OpTrace:
        from pacectl.traces.nccl_inspector import load_nccl_inspector

        return load_nccl_inspector(
            self.paths(), max_bytes=self.max_bytes, max_ops=self.max_ops, layout=self.layout(), name=self.name
        )


#: trace.format -> its typed config (an option of the ``trace`` group). Importers register here.
FORMATS: dict[str, type[TraceFormat]] = {
    cls.format: cls  # type: ignore[misc]
    for cls in (Bytedance, Canonical, Steplevel, Kineto, FlightRecorder, NcclInspector)
}


def trace_config(node: DictConfig | dict[str, Any], *, check_only: bool = False) -> TraceFormat:
    """The typed config of a ``trace`` node (composed by Hydra, or a plain mapping with ``format``),
    its ranges checked (``check_only``: also while a key that must be set is not, ``???``).

    Raises:
        ConfigError: an unknown ``trace.format``, a wrong type or an unknown key, or a value out of range.
        omegaconf.errors.MissingMandatoryValue: a key that must be set (``trace.path``) is not.
    """
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    try:
        if not (isinstance(kind, type) and issubclass(kind, TraceFormat)):
            fmt = node.get("format")
            if fmt not in FORMATS:
                raise ConfigError(f"trace.format must be one of {sorted(FORMATS)}, got {fmt!r}")
            node = OmegaConf.merge(OmegaConf.structured(FORMATS[fmt]), node)  # type: ignore[assignment]
        if check_only:
            cls = OmegaConf.get_type(node)
            given = OmegaConf.to_container(node, resolve=True)  # "???" kept as it is
            keys = {f.name for f in fields(cls)}  # type: ignore[arg-type]
            return cls(**{k: v for k, v in given.items() if k in keys})  # type: ignore[misc,no-any-return,union-attr]
        spec = OmegaConf.to_object(node)
    except MissingMandatoryValue:
        raise
    except OmegaConfBaseException as err:
        raise ConfigError(config_error(err, "trace")) from None
    assert isinstance(spec, TraceFormat)
    return spec
