"""Importer for PyTorch Flight Recorder dumps: one file per rank, into an :class:`OpTrace`.

Format (read from the torch sources, ``torch/csrc/distributed/c10d/FlightRecorder.hpp`` and
``FlightRecorderDetail.hpp``, and checked against real dumps of torch 2.13, see
``pacectl/data/flight-recorder/README.md``): each rank's recorder writes one object,

- ``version`` (``"2.10"`` in torch 2.13), ``pg_config`` (group name -> ``{name, desc, ranks}``,
  ``ranks`` a string such as ``"[0, 1]"``), ``pg_status`` (local group id ->
  ``last_enqueued_collective``, ``last_started_collective``, ``last_completed_collective``),
  ``comm_lib_version`` (``nccl_version`` before 2.10) and ``entries``: the ring buffer
  (``TORCH_FR_BUFFER_SIZE`` / ``TORCH_NCCL_TRACE_BUFFER_SIZE`` entries, oldest first), one per
  collective or point-to-point op with ``process_group`` = (name, desc), ``collective_seq_id``,
  ``p2p_seq_id``, ``is_p2p``, ``profiling_name`` (``nccl:all_reduce``, ``gloo:broadcast``, ...),
  ``input_sizes``, ``time_created_ns`` (host clock when the op was enqueued), ``duration_ms``
  (only with ``TORCH_NCCL_ENABLE_TIMING``: device start to end event), ``state``
  (``scheduled``/``started``/``completed``), ``retired`` and ``time_discovered_*_ns``;
- as a pickle (``torch._C._distributed_c10d._dump_fr_trace()``, what the default writer puts in
  ``TORCH_FR_DUMP_TEMP_FILE<rank>``) or as JSON (``_dump_fr_trace_json()``).

Versions 2.4 to 2.10 are read (:data:`VERSIONS`); the fields used here are the same in all of them.
Pickles are untrusted input: they are read by :class:`SafeUnpickler`, which builds only the plain
values a dump holds and refuses any class or function, so nothing in a file is ever executed.

What an entry means here:

- *finished*: ``state == "completed"``, or retired by gloo. ProcessGroupGloo records no device
  events, so its entries stay ``scheduled`` for ever, and it retires an entry when its work has run
  (``ProcessGroupGloo::runLoop``); on NCCL an entry retired without ``completed`` timed out.
- *timing*: ``duration_ms`` when every matched gradient collective carries it (clock-free, see
  :mod:`pacectl.traces.collectives`), else ``time_created_ns``: host enqueue times, assumed to share
  one clock unless their completions (enqueue + duration) say otherwise. ``time_discovered_*`` are
  the watchdog's observation times, not event times: never used.
- *hang snapshot*: a process group whose oldest unfinished collective some member rank never
  enqueued, or a dump set in which nothing finished (all entries ``scheduled``, as a dump taken on a
  timeout is). It cannot be replayed; :func:`hang_report` says, per process group, which ranks are
  behind. A gloo dump taken at the end of a healthy run has every entry retired.

- *point-to-point*: sends and recvs (``is_p2p``) are matched across ranks (:func:`match_p2p`) and
  *reported* (``info`` per pair; a warning on import when some are unmatched), not replayed: they
  fold into the compute gaps (:mod:`pacectl.traces.collectives`).

Files: a folder (every file in it that holds a dump, whatever its name), a glob or a list. The rank
of a file is the number that ends its name (``..._rank_3``, ``...rank3.json``; the convention of
torch's writer and its ``fr_trace`` analyzer), or ``ranks=`` in sorted-path order.

The layout, the step inference and the op table are :mod:`pacectl.traces.collectives`'.

Memory: files are read one at a time and compacted before the next (:func:`read_dumps`);
``trace.max_mb`` caps each file, ``trace.max_ops`` the entries of the set and the ops of the trace
(checked before its op table is built), so a refusal is one line with little held. The figures per
MB: ``experiments/bench/README.md`` (``results/flight_recorder.json``).
"""

from __future__ import annotations

import ast
import functools
import math
import pickle
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pacectl.errors import TraceError
from pacectl.traces.collectives import (
    CollectiveSet,
    Group,
    LayoutOverrides,
    assemble,
    kind_of,
)
from pacectl.traces.model import DEFAULT_MAX_BYTES, DEFAULT_MAX_OPS, OpTrace, TraceWarning, int64_array
from pacectl.traces.paths import expand_paths

#: Flight Recorder format versions this importer reads (``version`` of a dump).
VERSIONS = ("2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10")
#: The environment variables that make replayable dumps (named in the hang-snapshot refusal).
REPLAYABLE_ENV = (
    "TORCH_FR_BUFFER_SIZE (or TORCH_NCCL_TRACE_BUFFER_SIZE) large enough for a few steps, "
    "TORCH_NCCL_ENABLE_TIMING=1 for clock-free durations, and a dump taken while training runs "
    "(torch._C._distributed_c10d._dump_fr_trace()) rather than on a timeout"
)
_RANK_RE = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?$", re.IGNORECASE)
_JSON_KEYS = re.compile(rb'"(pg_config|collective_seq_id|comm_lib_version|nccl_version|pg_status)"')
_STATES = ("scheduled", "started", "completed")
#: builtins a dump may name (a pickle of plain values needs none; these build only plain values)
_SAFE_GLOBALS = frozenset(
    ("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset", "str", "int", "float", "bool")
)


class FlightRecorderWarning(TraceWarning):
    """A Flight Recorder dump set was usable, but something was dropped, guessed or assumed."""


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds plain values only (dicts, lists, tuples, strings, numbers, None).

    A Flight Recorder pickle holds nothing else (torch's c10 pickler writes dumps without any
    global reference; checked with ``pickletools`` on torch 2.13 dumps), so any class or function
    a file names is refused before it is looked up, let alone called.
    """

    def __init__(self, file: Any, *, source: str) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise TraceError(
            f"a Flight Recorder pickle must hold plain values only, got a reference to {module}.{name} "
            f"(in {self.source}); refused and not executed: the file is not a Flight Recorder dump "
            "(or was tampered with)"
        )


def sniff(path: Path) -> str | None:
    """``"pickle"`` or ``"json"`` when the file starts like a Flight Recorder dump, else None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return None
    if head[:1] == b"\x80" and b"pg_config" in head and b"entries" in head:
        return "pickle"
    text = head.lstrip()
    if text[:1] == b"{" and b'"traceEvents"' not in head and _JSON_KEYS.search(head):
        return "json"
    return None


def resolve_dump_paths(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    """Expand folders (their dump files), globs and files into a sorted list of dump files.

    Raises:
        TraceError: a path does not exist, a folder holds no dump, or a glob matches nothing.
    """

    def empty_folder(p: Path, files: int) -> str:
        got = "none" if not files else f"{files} file(s), none of them one"
        return (
            f"a Flight Recorder folder must hold per-rank dump files, got {got} in {str(p)!r} (a dump "
            "is the pickle of torch._C._distributed_c10d._dump_fr_trace() or its JSON form). "
            "Point trace.path at the folder the dumps were written to (TORCH_FR_DUMP_TEMP_FILE)."
        )

    return expand_paths(paths, what="Flight Recorder dump", accept=sniff, empty_folder=empty_folder)


# ----------------------------------------------------------------------------------------- one dump
@dataclass
class RankDump:
    """What one rank's dump holds, compacted (one row per entry in :attr:`entries`).

    Attributes:
        path: the file.
        rank: global rank of the dump.
        fmt: ``"pickle"`` or ``"json"``.
        version: the dump's format version.
        pg_config: group name -> ``(desc, ranks)`` as the dump declares it (ranks may be empty: gloo
            in torch 2.13 writes one empty-named group only).
        pg_status: local group id -> ``{last_enqueued, last_started, last_completed}`` (-1: none).
        entries: columns ``pg_name``, ``pg_desc``, ``pg_id``, ``seq`` (collective_seq_id),
            ``p2p_seq``, ``is_p2p``, ``backend``, ``kind``, ``op`` (profiling name without backend),
            ``numel``, ``created_ns`` (int64), ``duration_ms`` (NaN if absent), ``state``, ``retired``.
    """

    path: Path
    rank: int
    fmt: str
    version: str
    pg_config: dict[str, tuple[str, tuple[int, ...]]]
    pg_status: dict[int, dict[str, int]]
    entries: pd.DataFrame = field(repr=False)

    @property
    def finished(self) -> np.ndarray:
        """``bool[n]``: entry completed, or retired by gloo (see the module docstring)."""
        e = self.entries
        return ((e["state"] == "completed") | (e["retired"] & (e["backend"] == "gloo"))).to_numpy()


def _where(path: Path, i: int | None, key: str) -> str:
    return f"in {path}: entry #{i}, key {key}" if i is not None else f"in {path}: key {key}"


def _parse_ranks(raw: Any, path: Path, name: str) -> tuple[int, ...]:
    if isinstance(raw, str):
        try:
            raw = ast.literal_eval(raw.strip() or "[]")
        except (ValueError, SyntaxError) as err:
            raise TraceError(
                f"pg_config ranks must be a list of ranks such as '[0, 1]', got {raw!r} "
                f"(in {path}: pg_config[{name!r}].ranks)"
            ) from err
    if not isinstance(raw, (list, tuple)) or not all(isinstance(r, int) and r >= 0 for r in raw):
        raise TraceError(
            f"pg_config ranks must be a list of non-negative ranks, got {raw!r} (in {path}: pg_config[{name!r}].ranks)"
        )
    return tuple(sorted(int(r) for r in raw))


def _int_or(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@functools.lru_cache(maxsize=4096)
def _split_name(name: str) -> tuple[str, str]:
    """``("nccl", "all_reduce")`` for ``"nccl:all_reduce"``; ``("", name)`` without a backend."""
    backend, _, op = name.partition(":")
    return (backend, op) if op else ("", name)


def _numel(sizes: Any) -> int:
    total = 0
    if isinstance(sizes, list):
        for s in sizes:
            if isinstance(s, list) and all(isinstance(d, int) for d in s):
                total += math.prod(s)
    return total


class _Columns:
    """Growing per-entry columns (plain lists; turned into a DataFrame at the end)."""

    NAMES = (
        "pg_name", "pg_desc", "pg_id", "seq", "p2p_seq", "is_p2p", "backend", "kind", "op",
        "numel", "created_ns", "duration_ms", "state", "retired",
    )  # fmt: skip

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {n: [] for n in self.NAMES}

    def add(self, e: Any, i: int, path: Path) -> None:
        if not isinstance(e, dict):
            raise TraceError(
                f"each Flight Recorder entry must be an object, got {type(e).__name__} ({_where(path, i, 'entries')})"
            )
        try:
            pg, name, created, seq = (
                e["process_group"],
                e["profiling_name"],
                e["time_created_ns"],
                e["collective_seq_id"],
            )
        except KeyError as err:
            key = err.args[0]
            raise TraceError(
                f"a Flight Recorder entry must have {key!r}, got keys {sorted(e)[:8]} ({_where(path, i, key)}); "
                "is this a Flight Recorder dump of a supported version?"
            ) from None
        if type(pg) not in (list, tuple) or len(pg) != 2:
            raise TraceError(
                f"process_group must be [name, desc], got {pg!r} ({_where(path, i, 'process_group')})"
            )
        for key, value, unit in (("time_created_ns", created, " (ns)"), ("collective_seq_id", seq, "")):
            if type(value) is not int or value < 0:
                raise TraceError(
                    f"{key} must be a non-negative integer{unit}, got {value!r} ({_where(path, i, key)})"
                )
        duration = e.get("duration_ms")
        if duration is not None and (
            type(duration) not in (int, float) or not (0 <= duration < 7 * 24 * 3600e3)  # NaN fails too
        ):
            raise TraceError(
                f"duration_ms must be a finite number of milliseconds >= 0, got {duration!r} "
                f"({_where(path, i, 'duration_ms')})"
            )
        state = e.get("state", "scheduled")
        if state not in _STATES:
            raise TraceError(
                f"state must be one of {list(_STATES)}, got {state!r} ({_where(path, i, 'state')})"
            )
        backend, op = _split_name(str(name))
        kind = kind_of(op)
        p2p = e.get("is_p2p")
        c = self.cols
        c["pg_name"].append(str(pg[0]))
        c["pg_desc"].append(str(pg[1]))
        c["pg_id"].append(_int_or(e.get("pg_id"), -1))
        c["seq"].append(seq)
        c["p2p_seq"].append(_int_or(e.get("p2p_seq_id"), 0))
        c["is_p2p"].append(bool(p2p) if p2p is not None else kind in ("send", "recv"))
        c["backend"].append(backend)
        c["kind"].append(kind)
        c["op"].append(op)
        c["numel"].append(_numel(e.get("input_sizes")))
        c["created_ns"].append(created)
        c["duration_ms"].append(float(duration) if duration is not None else math.nan)
        c["state"].append(state)
        c["retired"].append(bool(e.get("retired", False)))

    def frame(self, path: Path) -> pd.DataFrame:
        c = self.cols

        def int64(column: str, key: str) -> np.ndarray:  # a damaged number past int64: one line
            return int64_array(c[column], field=key, source=f"{path}: key entries[*].{key}")

        return pd.DataFrame(
            {
                "pg_name": pd.Categorical(c["pg_name"]),
                "pg_desc": pd.Categorical(c["pg_desc"]),
                "pg_id": int64("pg_id", "pg_id"),
                "seq": int64("seq", "collective_seq_id"),
                "p2p_seq": int64("p2p_seq", "p2p_seq_id"),
                "is_p2p": np.asarray(c["is_p2p"], dtype=bool),
                "backend": pd.Categorical(c["backend"]),
                "kind": pd.Categorical(c["kind"]),
                "op": pd.Categorical(c["op"]),
                "numel": int64("numel", "input_sizes"),
                "created_ns": int64("created_ns", "time_created_ns"),
                "duration_ms": np.asarray(c["duration_ms"], dtype=np.float64),
                "state": pd.Categorical(c["state"], categories=list(_STATES)),
                "retired": np.asarray(c["retired"], dtype=bool),
            }
        )


def _check_version(raw: Any, path: Path) -> str:
    version = str(raw)
    if version not in VERSIONS:
        raise TraceError(
            f"a Flight Recorder dump's version must be one of {list(VERSIONS)}, got {version!r} (in {path}: key version). "
            "pacectl reads the formats 2.4 to 2.10 (torch 2.13 writes 2.10); convert or re-record the dump "
            "with a torch whose format is among them"
        )
    return version


def _config(raw: Any, path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise TraceError(
            f"pg_config must be an object of groups, got {type(raw).__name__} (in {path}: key pg_config)"
        )
    out = {}
    for name, info in raw.items():
        if not isinstance(info, dict):
            raise TraceError(
                f"pg_config[{name!r}] must be an object, got {info!r} (in {path}: key pg_config)"
            )
        out[str(info.get("name", name))] = (
            str(info.get("desc", "")),
            _parse_ranks(info.get("ranks", "[]"), path, str(name)),
        )
    return out


def _status(raw: Any) -> dict[int, dict[str, int]]:
    if not isinstance(raw, dict):
        return {}
    out = {}
    for pg_id, st in raw.items():
        if isinstance(st, dict):
            out[_int_or(pg_id, -1)] = {
                k: _int_or(st.get(f"last_{k}_collective"), -1) for k in ("enqueued", "started", "completed")
            }
    return out


def read_dump(path: str | Path, *, rank: int | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> RankDump:
    """Read one rank's Flight Recorder dump (pickle or JSON, by its first bytes), in bounded memory.

    Args:
        path: the dump file.
        rank: its global rank (default: the number that ends the file name).
        max_bytes: cap on the file's size, bytes.

    Returns:
        The compacted :class:`RankDump`.

    Raises:
        TraceError: the file is missing, too large, truncated, not a dump, of an unknown version, or
            holds an entry without a field the import needs; a pickle that names a class or function
            (refused unexecuted, see :class:`SafeUnpickler`).
    """
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace.path must name existing dump files, got {str(p)!r}")
    size = p.stat().st_size
    if size > max_bytes:
        raise TraceError(
            f"a Flight Recorder dump must be <= {max_bytes} bytes (trace.max_mb), got {size} bytes (in {p}). "
            "Raise the cap (trace.max_mb / --max-mb) if the file is genuine."
        )
    if size == 0:
        raise TraceError(
            f"a Flight Recorder dump must not be empty, got an empty file (in {p}). Copy or dump it again."
        )
    kind = sniff(p)
    if rank is None:
        named = _RANK_RE.search(p.name)
        if named is None:
            raise TraceError(
                f"a dump file's name must end in its rank (as torch's writer names them: <prefix><rank>), got "
                f"{p.name!r} (in {p.parent}); rename it or pass the ranks (trace.ranks / --rank)"
            )
        rank = int(named.group(1))
    if kind == "pickle":
        return _read_pickle(p, rank)
    if kind == "json":
        return _read_json(p, rank)
    with open(p, "rb") as fh:
        head = fh.read(2)
    if head[:1] == b"\x80":
        raise TraceError(
            f"a Flight Recorder dump must be a pickle of the recorder's dict (keys version, pg_config, entries), "
            f"got a pickle without them (in {p}); it is not a Flight Recorder dump, or it is cut short"
        )
    raise TraceError(
        f"a Flight Recorder dump must be a pickle or JSON object with keys version, pg_config and entries, "
        f"got neither (in {p}). Is it a Flight Recorder dump (torch._C._distributed_c10d._dump_fr_trace())?"
    )


def _read_pickle(p: Path, rank: int) -> RankDump:
    # Unpickled from the file as it is read (no copy of its bytes beside the values). The values
    # are the transient peak of a pickle's import, freed entry by entry as they are compacted.
    try:
        with open(p, "rb") as fh:
            obj = SafeUnpickler(fh, source=str(p)).load()  # its memo goes with it
    except TraceError:
        raise
    except EOFError as err:
        raise TraceError(
            f"a Flight Recorder pickle must be complete, got a file that ends early (truncated after "
            f"{p.stat().st_size} bytes) (in {p}). Copy or dump it again."
        ) from err
    except (
        pickle.UnpicklingError,
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        AttributeError,
        MemoryError,
        OverflowError,  # a damaged length field (BYTEARRAY8 claiming 2**63 bytes)
    ) as err:
        truncated = "truncated" in str(err) or "ran out" in str(err).lower()
        why = "it ends early (truncated)" if truncated else f"it is corrupt ({type(err).__name__}: {err})"
        raise TraceError(
            f"a Flight Recorder pickle must load, got a file that does not: {why} (in {p}). Copy or dump it again."
        ) from err
    if not isinstance(obj, dict) or "entries" not in obj and "version" not in obj:
        raise TraceError(
            f"a Flight Recorder pickle must hold the recorder's dict (keys version, pg_config, entries), got "
            f"{type(obj).__name__} (in {p})"
        )
    if "version" not in obj:
        raise TraceError(
            f"a Flight Recorder dump must have key 'version', got keys {sorted(obj)[:8]} (in {p})"
        )
    version = _check_version(obj["version"], p)
    cols = _Columns()
    entries = obj.get("entries", [])
    if not isinstance(entries, list):
        raise TraceError(f"entries must be a list, got {type(entries).__name__} (in {p}: key entries)")
    for i in range(len(entries)):
        e, entries[i] = entries[i], None  # each entry's values are freed once compacted
        cols.add(e, i, p)
    config, status = _config(obj.get("pg_config"), p), _status(obj.get("pg_status"))
    del obj, entries
    return RankDump(p, rank, "pickle", version, config, status, cols.frame(p))


def _read_json(p: Path, rank: int) -> RankDump:
    import ijson

    cols = _Columns()
    top: dict[str, Any] = {}
    try:
        with open(p, "rb") as fh:
            for i, e in enumerate(ijson.items(fh, "entries.item", use_float=True)):
                cols.add(e, i, p)
        for key in ("version", "pg_config", "pg_status"):
            with open(p, "rb") as fh:
                for value in ijson.items(fh, key, use_float=True):
                    top[key] = value
                    break
    except ijson.IncompleteJSONError as err:
        where = f"after {len(cols.cols['seq'])} entries" if cols.cols["seq"] else "before the first entry"
        cut = "incomplete" in str(err).lower() or "premature" in str(err).lower()
        why = "it ends early (truncated)" if cut else f"it is malformed ({str(err).strip()})"
        raise TraceError(
            f"a Flight Recorder JSON dump must be valid JSON, got a file where {why} {where} (in {p}). Copy or dump it again."
        ) from err
    except ijson.JSONError as err:
        raise TraceError(
            f"a Flight Recorder JSON dump must be valid JSON, got {str(err).strip()} (in {p})"
        ) from err
    if "version" not in top:
        raise TraceError(f"a Flight Recorder dump must have key 'version', got none (in {p})")
    version = _check_version(top["version"], p)
    config, status = _config(top.get("pg_config"), p), _status(top.get("pg_status"))
    return RankDump(p, rank, "json", version, config, status, cols.frame(p))


# ----------------------------------------------------------------------------------------- the set
def read_dumps(
    paths: str | Path | Sequence[str | Path],
    *,
    ranks: Sequence[int] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_ops: int = DEFAULT_MAX_OPS,
) -> list[RankDump]:
    """Read every dump of a set, one file at a time, sorted by rank (see :func:`read_dump`).

    Each file's values are compacted before the next file is read, so the set is held as compact
    columns, never as raw dumps; ``max_ops`` caps the entries over the set, checked after each file.

    Raises:
        TraceError: as :func:`read_dump`; two files claim one rank; ``ranks`` does not give one rank
            per file; the files hold more than ``max_ops`` entries together.
    """
    files = resolve_dump_paths(paths)
    if ranks is not None and len(ranks) != len(files):
        raise TraceError(
            f"trace.ranks must give one rank per dump file ({len(files)} files: {[f.name for f in files][:8]}), "
            f"got {list(ranks)!r}"
        )
    dumps: list[RankDump] = []
    held = 0
    for i, f in enumerate(files):
        dumps.append(read_dump(f, rank=None if ranks is None else int(ranks[i]), max_bytes=max_bytes))
        held += len(dumps[-1].entries)
        if held > max_ops:
            raise TraceError(
                f"a Flight Recorder dump set must hold <= {max_ops} entries (trace.max_ops), got {held} in its "
                f"first {i + 1} of {len(files)} files (in {f.parent}); the import holds about 0.2 kB per entry "
                "and 0.4 kB per op of the trace it builds. Raise the cap (trace.max_ops / --max-ops) if the "
                "machine has the memory, or import fewer ranks or a smaller ring buffer"
            )
    seen: dict[int, Path] = {}
    for d in dumps:
        if d.rank in seen:
            raise TraceError(
                f"each rank must have one dump, got two for rank {d.rank}: {seen[d.rank].name} and {d.path.name} "
                f"(in {d.path.parent}); keep one job's dumps in the folder or pass trace.ranks"
            )
        seen[d.rank] = d.path
    versions = sorted({d.version for d in dumps})
    if len(versions) > 1:
        warnings.warn(
            f"{dumps[0].path.parent}: the dumps have different format versions {versions}; read alike",
            FlightRecorderWarning,
            stacklevel=2,
        )
    return sorted(dumps, key=lambda d: d.rank)


def process_groups(dumps: list[RankDump]) -> tuple[list[Group], dict[tuple[int, str, str], int]]:
    """The process groups of a dump set, identified by name plus rank set.

    Members come from ``pg_config`` where a dump declares the group with its ranks; otherwise (gloo
    in torch 2.13 declares none) from the dumps whose entries use it. A name that two rank sets use
    (reused after ``split_group``) is two groups.

    Returns:
        ``(groups, index)``: the groups, and ``(rank, name, desc) -> group key`` for every entry's group.
    """
    declared: dict[tuple[str, str], set[tuple[int, ...]]] = {}
    used: dict[tuple[str, str], set[int]] = {}
    for d in dumps:
        pairs = d.entries[["pg_name", "pg_desc"]].drop_duplicates()
        for name, desc in pairs.itertuples(index=False):
            used.setdefault((str(name), str(desc)), set()).add(d.rank)
        for name, (desc, ranks) in d.pg_config.items():
            if ranks and d.rank in ranks:
                declared.setdefault((name, desc), set()).add(ranks)
    groups: list[Group] = []
    index: dict[tuple[int, str, str], int] = {}
    by_members: dict[tuple[str, str, tuple[int, ...]], int] = {}

    def natural(item: tuple[tuple[str, str], set[int]]) -> tuple[int, str, str]:
        (name, desc), _ = item
        return (int(name) if name.isdigit() else 1 << 62, name, desc)

    for (name, desc), users in sorted(used.items(), key=natural):
        sets = declared.get((name, desc), set())
        for r in sorted(users):
            members = next((s for s in sets if r in s), None)
            source = "pg_config"
            if members is None:
                members, source = tuple(sorted(users)), "dumps"
            key = (name, desc, members)
            if key not in by_members:
                by_members[key] = len(groups)
                groups.append(Group(key=len(groups), name=name, desc=desc, ranks=members, ranks_from=source))
            index[(r, name, desc)] = by_members[key]
    return groups, index


def _group_keys(
    d: RankDump, sel: np.ndarray, index: dict[tuple[int, str, str], int]
) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, inverse)``: the group key of each distinct process group among ``d``'s entries
    ``sel``, and each entry's position in ``keys`` (vectorized over the (name, desc) category codes)."""
    names, descs = d.entries["pg_name"].cat, d.entries["pg_desc"].cat
    nd = len(descs.categories)
    pair = names.codes.to_numpy(np.int64)[sel] * nd + descs.codes.to_numpy(np.int64)[sel]
    uniq, inverse = np.unique(pair, return_inverse=True)
    keys = [index[(d.rank, str(names.categories[u // nd]), str(descs.categories[u % nd]))] for u in uniq]
    return np.asarray(keys, dtype=np.int64), inverse


def collective_set(dumps: list[RankDump], *, source: str) -> tuple[CollectiveSet, list[Group]]:
    """Every rank's finished collectives (not point-to-point) as one :class:`CollectiveSet`.

    Each column is allocated once for the whole set and filled dump by dump (the only copy made).
    """
    groups, index = process_groups(dumps)
    keeps = [~d.entries["is_p2p"].to_numpy() for d in dumps]
    total = int(sum(k.sum() for k in keeps))
    if not total:
        raise TraceError(
            f"a Flight Recorder dump set must record at least one collective, got none (in {source}); "
            "set TORCH_FR_BUFFER_SIZE before init_process_group and dump after some training steps"
        )
    kinds = sorted({str(c) for d in dumps for c in d.entries["kind"].cat.categories})
    backends = sorted({str(c) for d in dumps for c in d.entries["backend"].cat.categories})
    cols: dict[str, np.ndarray] = {
        "rank": np.empty(total, np.int64),
        "group": np.empty(total, np.int64),
        "kind": np.empty(total, np.int32),  # codes into ``kinds``
        "backend": np.empty(total, np.int32),
        "seq": np.empty(total, np.int64),
        "numel": np.empty(total, np.int64),
        "created_ns": np.empty(total, np.int64),
        "duration_s": np.empty(total, np.float64),
        "end_ns": np.full(total, -1, dtype=np.int64),
        "finished": np.empty(total, bool),
    }
    at = 0
    for d, keep in zip(dumps, keeps, strict=True):
        n = int(keep.sum())
        if not n:
            continue
        e, part = d.entries, slice(at, at + n)
        keys, inverse = _group_keys(d, keep, index)
        cols["rank"][part] = d.rank
        cols["group"][part] = keys[inverse]
        for name, cats in (("kind", kinds), ("backend", backends)):
            local = e[name].cat
            remap = np.asarray([cats.index(str(c)) for c in local.categories], dtype=np.int32)
            cols[name][part] = remap[local.codes.to_numpy()[keep]]
        for name, col in (("seq", "seq"), ("numel", "numel"), ("created_ns", "created_ns")):
            cols[name][part] = e[col].to_numpy()[keep]
        cols["duration_s"][part] = e["duration_ms"].to_numpy()[keep] * 1e-3
        cols["finished"][part] = d.finished[keep]
        at += n
    table = pd.DataFrame(
        {
            **cols,  # in place: the kind and backend codes as categoricals
            "kind": pd.Categorical.from_codes(cols["kind"], categories=kinds),
            "backend": pd.Categorical.from_codes(cols["backend"], categories=backends),
        },
        copy=False,
    )
    return CollectiveSet(table=table, ranks=tuple(d.rank for d in dumps)), groups


# ----------------------------------------------------------------------------------- hang snapshots
@dataclass(frozen=True)
class GroupStatus:
    """Where each member rank of one process group stands (the ``info`` "behind" report).

    Attributes:
        group: the process group.
        last_enqueued, last_started, last_completed: per member rank (in :attr:`Group.ranks`
            order), the collective_seq_id of the last collective it enqueued, started and finished
            (-1: none recorded; ``started`` is unknown on gloo, which records no start events).
        oldest_unfinished: the lowest collective_seq_id some member enqueued and has not finished
            (None: none).
        oldest_op: its op name (``all_reduce``) or "".
        waiting: member ranks that enqueued it and wait in it.
        behind: member ranks that never enqueued it (the ranks the others wait for).
        missing_dumps: member ranks with no dump in the set.
    """

    group: Group
    last_enqueued: tuple[int, ...]
    last_started: tuple[int, ...]
    last_completed: tuple[int, ...]
    oldest_unfinished: int | None
    oldest_op: str
    waiting: tuple[int, ...]
    behind: tuple[int, ...]
    missing_dumps: tuple[int, ...]

    @property
    def hung(self) -> bool:
        """Some member never reached a collective that others wait in."""
        return self.oldest_unfinished is not None and bool(self.behind)


def hang_report(dumps: list[RankDump]) -> list[GroupStatus]:
    """Per process group: the last collective each rank enqueued, started and finished, and which
    ranks are missing from the oldest unfinished one (from the entries, and ``pg_status`` where the
    entries have fallen off the ring buffer)."""
    groups, index = process_groups(dumps)
    by_rank = {d.rank: d for d in dumps}
    out = []
    with_collectives = {
        index[(d.rank, str(n), str(s))]
        for d in dumps
        for n, s in d.entries.loc[~d.entries["is_p2p"], ["pg_name", "pg_desc"]]
        .drop_duplicates()
        .itertuples(index=False)
    }
    for g in groups:
        if g.key not in with_collectives:
            continue  # only point-to-point ops: nothing to match by collective_seq_id
        enq, sta, com = [], [], []
        unfinished: dict[int, set[int]] = {}
        op_of: dict[int, str] = {}
        for r in g.ranks:
            d = by_rank.get(r)
            if d is None:
                enq.append(-1)
                sta.append(-1)
                com.append(-1)
                continue
            e = d.entries
            mine = (e["pg_name"].astype(str) == g.name).to_numpy() & (
                e["pg_desc"].astype(str) == g.desc
            ).to_numpy()
            mine &= ~e["is_p2p"].to_numpy()
            seq = e["seq"].to_numpy()[mine]
            fin = d.finished[mine]
            started = (e["state"].to_numpy()[mine] != "scheduled") | fin
            status = next(
                (st for pid, st in d.pg_status.items() if pid in set(e["pg_id"].to_numpy()[mine].tolist())),
                None,
            )
            enq.append(max(int(seq.max()) if len(seq) else -1, status["enqueued"] if status else -1))
            sta.append(int(seq[started].max()) if started.any() else (status["started"] if status else -1))
            com.append(max(int(seq[fin].max()) if fin.any() else -1, status["completed"] if status else -1))
            ops = e["op"].astype(str).to_numpy()[mine]
            for s, o in zip(seq[~fin], ops[~fin], strict=True):
                unfinished.setdefault(int(s), set()).add(r)
                op_of[int(s)] = str(o)
        oldest = min(unfinished) if unfinished else None
        waiting = tuple(sorted(unfinished[oldest])) if oldest is not None else ()
        behind = tuple(
            r
            for r, e_last in zip(g.ranks, enq, strict=True)
            if oldest is not None and e_last < oldest and r in by_rank
        )
        out.append(
            GroupStatus(
                group=g,
                last_enqueued=tuple(enq),
                last_started=tuple(sta),
                last_completed=tuple(com),
                oldest_unfinished=oldest,
                oldest_op=op_of.get(oldest, "") if oldest is not None else "",
                waiting=waiting,
                behind=behind,
                missing_dumps=tuple(r for r in g.ranks if r not in by_rank),
            )
        )
    return out


def is_hang_snapshot(dumps: list[RankDump], statuses: list[GroupStatus] | None = None) -> str | None:
    """Why the dump set is a hang snapshot (one sentence), or None when it is replayable in principle."""
    statuses = hang_report(dumps) if statuses is None else statuses
    hung = [s for s in statuses if s.hung]
    if hung:
        s = hung[0]
        return (
            f"process group {s.group.label}: ranks {list(s.behind)} never entered {s.oldest_op or 'collective'} "
            f"#{s.oldest_unfinished}, which ranks {list(s.waiting)} wait in"
        )
    if not any(d.finished.any() for d in dumps):
        return "no entry of any dump has finished (every entry is scheduled: a dump taken on a timeout)"
    return None


def describe_status(statuses: list[GroupStatus]) -> list[str]:
    """The "behind" report as lines (one header and one line per rank per group)."""
    lines = []
    for s in statuses:
        head = f"group {s.group.label} (ranks {list(s.group.ranks)[:16]}{' ...' if len(s.group.ranks) > 16 else ''})"
        if s.oldest_unfinished is None:
            lines.append(f"{head}: nothing unfinished")
        else:
            lines.append(
                f"{head}: oldest unfinished {s.oldest_op} #{s.oldest_unfinished}; waiting in it: {list(s.waiting)}; "
                f"behind (never entered it): {list(s.behind) or 'none'}"
            )
        if s.missing_dumps:
            lines.append(f"  no dump from ranks {list(s.missing_dumps)}")
        for r, a, b, c in zip(s.group.ranks, s.last_enqueued, s.last_started, s.last_completed, strict=True):
            if r in s.missing_dumps:
                continue
            mark = "  <- behind" if r in s.behind else ""
            started = "unknown" if b < 0 else str(b)
            lines.append(f"  rank {r}: last enqueued #{a}, started #{started}, completed #{c}{mark}")
    return lines


# ------------------------------------------------------------------------------- point-to-point
_P2P_NAME = re.compile(r"^(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)$")
#: the columns of :attr:`P2PReport.matches`
_MATCH_COLUMNS = (
    "group", "src", "dst", "send_seq", "recv_seq", "numel", "send_created_ns", "recv_created_ns", "finished",
)  # fmt: skip


@dataclass(frozen=True)
class P2PPair:
    """The point-to-point ops of one ordered pair (``src`` sends to ``dst``) in one process group.

    Attributes:
        group: the process group.
        src, dst: global ranks (the sender and the receiver).
        by: ``"p2p_seq_id"`` (matched on equal ids) or ``"order"`` (k-th send with k-th recv; see
            :func:`match_p2p`).
        matched: send/recv pairs found.
        size_mismatch: of those, pairs whose send and recv sizes differ.
        unmatched_sends, unmatched_recvs: ``p2p_seq_id`` of the ops with no other side.
        why: one sentence per reason the unmatched ones have (empty when all matched).
    """

    group: Group
    src: int
    dst: int
    by: str
    matched: int
    size_mismatch: int
    unmatched_sends: tuple[int, ...]
    unmatched_recvs: tuple[int, ...]
    why: tuple[str, ...]

    @property
    def unmatched(self) -> int:
        return len(self.unmatched_sends) + len(self.unmatched_recvs)

    def summary(self) -> dict[str, Any]:
        """Plain values for JSON outputs."""
        return {
            "group": self.group.label,
            "src": self.src,
            "dst": self.dst,
            "by": self.by,
            "matched": self.matched,
            "size_mismatch": self.size_mismatch,
            "unmatched_sends": list(self.unmatched_sends),
            "unmatched_recvs": list(self.unmatched_recvs),
            "why": list(self.why),
        }


@dataclass
class P2PReport:
    """How a dump set's point-to-point ops were matched (see :func:`match_p2p`).

    Attributes:
        pairs: one row per ordered pair and group that recorded a send or recv.
        matches: one row per matched pair of ops: ``group`` (key), ``src``, ``dst`` (global),
            ``send_seq``, ``recv_seq`` (``p2p_seq_id`` on each side), ``numel``, ``send_created_ns``,
            ``recv_created_ns``, ``finished`` (both sides).
        other: p2p entries that are not a send or recv with readable peers, by what they are
            (``coalesced``: the end-of-batch entry of ``batch_isend_irecv``; ``unreadable peer``:
            a name without ``a->b`` / ``a<-b`` or a peer outside its group).
    """

    pairs: list[P2PPair]
    matches: pd.DataFrame = field(repr=False)
    other: dict[str, int] = field(default_factory=dict)

    @property
    def matched(self) -> int:
        return sum(p.matched for p in self.pairs)

    @property
    def unmatched(self) -> int:
        return sum(p.unmatched for p in self.pairs)

    def summary(self) -> dict[str, Any]:
        """Plain values for JSON outputs."""
        return {
            "matched": self.matched,
            "unmatched": self.unmatched,
            "pairs": [p.summary() for p in self.pairs],
            "other": dict(self.other),
            "used_by_replay": False,
        }

    def lines(self) -> list[str]:
        """The per-pair report (``traces info``)."""
        if not self.pairs and not self.other:
            return []
        out = []
        for p in self.pairs:
            line = f"{p.group.label} {p.src} -> {p.dst}: {p.matched} matched (by {p.by})"
            if p.size_mismatch:
                line += f", {p.size_mismatch} with different send and recv sizes"
            if p.unmatched:
                line += (
                    f"; UNMATCHED {len(p.unmatched_sends)} send(s) {_ids(p.unmatched_sends)} and "
                    f"{len(p.unmatched_recvs)} recv(s) {_ids(p.unmatched_recvs)} (p2p_seq_id): {'; '.join(p.why)}"
                )
            out.append(line)
        if self.other:
            out.append(f"not matched (not a send/recv with readable peers): {self.other}")
        return out


def _ids(ids: tuple[int, ...], limit: int = 8) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return f"[{shown}{' ...' if len(ids) > limit else ''}]"


def _parse_p2p_names(names: list[str]) -> np.ndarray:
    """``int64[4, len(names)]``: readable as a send/recv (1/0), is a send (1/0), group-local source
    and destination (-1: none), of op names such as ``send 0->1`` / ``recv 1<-0``."""
    out = np.full((4, len(names)), -1, dtype=np.int64)
    out[:2] = 0
    for i, name in enumerate(names):
        m = _P2P_NAME.match(name.strip())
        if m is not None:
            a, b = int(m.group(2)), int(m.group(4))
            out[:, i] = (1, m.group(1) == "send", *((a, b) if m.group(3) == "->" else (b, a)))
    return out


def _p2p_rows(
    dumps: list[RankDump], groups: list[Group], index: dict[tuple[int, str, str], int]
) -> tuple[pd.DataFrame, dict[str, int]]:
    """One row per send/recv entry, peers as global ranks; counts of the p2p entries left out.

    Vectorized per dump: op names and groups are parsed once per distinct value (their
    categories), not once per entry.
    """
    parts: list[pd.DataFrame] = []
    other: dict[str, int] = {}
    for d in dumps:
        e = d.entries
        p2p = e["is_p2p"].to_numpy()
        if not p2p.any():
            continue
        op = e["op"].cat
        names_of = _parse_p2p_names([str(c) for c in op.categories])  # [4, categories]
        valid, send, src_l, dst_l = names_of[:, op.codes.to_numpy()[p2p]]
        valid, send = valid == 1, send == 1
        coalesced = int((~valid & (e["kind"].to_numpy()[p2p] == "coalesced")).sum())
        if coalesced:
            other["coalesced"] = coalesced + other.get("coalesced", 0)
        keys, inverse = _group_keys(d, p2p, index)
        gk = keys[inverse]
        src, dst = np.full(len(gk), -1, np.int64), np.full(len(gk), -1, np.int64)
        for u, k in enumerate(keys):
            members = np.asarray(groups[k].ranks, dtype=np.int64)
            sel = (inverse == u) & valid & (src_l < len(members)) & (dst_l < len(members))
            src[sel], dst[sel] = members[src_l[sel]], members[dst_l[sel]]
        # readable, and its own side is this rank
        ok = valid & (src >= 0) & (dst >= 0) & (np.where(send, src, dst) == d.rank)
        bad = int((~ok).sum()) - coalesced
        if bad:
            other["unreadable peer"] = bad + other.get("unreadable peer", 0)
        parts.append(
            pd.DataFrame(
                {
                    "group": gk[ok],
                    "kind": np.where(send, "send", "recv")[ok],
                    "src": src[ok],
                    "dst": dst[ok],
                    "seq": e["p2p_seq"].to_numpy()[p2p][ok],
                    "numel": e["numel"].to_numpy()[p2p][ok],
                    "created_ns": e["created_ns"].to_numpy()[p2p][ok],
                    "finished": d.finished[p2p][ok],
                    "rank": d.rank,
                }
            )
        )
    return (pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()), other


def _paired(sends: pd.DataFrame, recvs: pd.DataFrame) -> pd.DataFrame:
    """Matched ops, row i of ``sends`` with row i of ``recvs``."""
    return pd.DataFrame(
        {
            "send_seq": sends["seq"].to_numpy(np.int64),
            "recv_seq": recvs["seq"].to_numpy(np.int64),
            "numel": sends["numel"].to_numpy(np.int64),
            "recv_numel": recvs["numel"].to_numpy(np.int64),
            "send_created_ns": sends["created_ns"].to_numpy(np.int64),
            "recv_created_ns": recvs["created_ns"].to_numpy(np.int64),
            "finished": sends["finished"].to_numpy(bool) & recvs["finished"].to_numpy(bool),
        }
    )


def match_p2p(
    dumps: list[RankDump], groups: tuple[list[Group], dict[tuple[int, str, str], int]] | None = None
) -> P2PReport:
    """Match every send with its recv: by process group, ordered pair and ``p2p_seq_id``.

    What ``p2p_seq_id`` counts (torch 2.13's ``ProcessGroupNCCL``, ``ProcessGroupNCCL.hpp``
    member ``seqP2P_``, "the sequential number of NCCL P2P calls", and ``pointToPoint`` /
    ``startCoalescing`` in ``ProcessGroupNCCL.cpp``): one counter per process group object, so per
    rank and group, bumped before each send or recv is recorded (the first is 1), and once per
    ``batch_isend_irecv`` batch, whose ops share it; it counts a rank's p2p ops with *every* peer
    in the group. The entry names the peers in group-local ranks (``nccl:send 0->1``,
    ``nccl:recv 1<-0``; torch's ``fr_trace`` analyzer maps them through the group's sorted ranks,
    ``flight_recorder/components/types.py`` ``Op``), as done here. ProcessGroupGloo records no
    send or recv in torch 2.13 (checked: ``send``, ``recv``, ``isend``/``irecv`` and
    ``batch_isend_irecv``, default and new groups, leave no entry).

    So, per group:

    - where every rank of the group sends to and receives from one peer only in it (a 2-rank
      pipeline group, the usual PP group of a 2-stage pipeline), both sides of a pair count the
      same ops and a send on ``a`` to ``b`` and the recv on ``b`` from ``a`` carry the same
      ``p2p_seq_id``: they are matched on ``(group, a, b, p2p_seq_id)`` (``by = "p2p_seq_id"``;
      several ops of one direction with one id, as in a batch, in order of enqueue time);
    - where a rank has several peers in the group (a middle stage of a pipeline group of 3 or more),
      its ``p2p_seq_id`` counts the ops with both neighbours and is not comparable across a pair;
      the k-th send from ``a`` to ``b`` is then matched with the k-th recv on ``b`` from ``a`` (NCCL
      and gloo deliver one pair's messages in issue order), in ``p2p_seq_id`` order, and only when
      both sides recorded as many (``by = "order"``); otherwise none of the pair's ops is matched:
      which ones fell off a ring buffer cannot be told.

    An op without its other side is reported, never paired with a wrong one, with why: no dump
    from the peer; before the peer's oldest recorded p2p op on the group (its ring buffer wrapped);
    after its newest (posted after the peer dumped, or still in flight); or inside its range (the
    peer recorded no such op: a desync). Matched sends and recvs of different sizes are counted.

    Args:
        dumps: the dump set (:func:`read_dumps`).
        groups: its :func:`process_groups` (computed when not given).

    Returns:
        The :class:`P2PReport`.
    """
    group_list, index = groups if groups is not None else process_groups(dumps)
    rows, other = _p2p_rows(dumps, group_list, index)
    have = {d.rank for d in dumps}
    pairs: list[P2PPair] = []
    matches: list[pd.DataFrame] = []
    if len(rows):
        peers = rows.assign(peer=np.where(rows["kind"] == "send", rows["dst"], rows["src"]))
        many = peers.groupby(["group", "rank"])["peer"].nunique()
        by_order = {int(gk) for (gk, _), n in many.items() if n > 1}
        span = rows.groupby(["group", "rank"])["seq"].agg(["min", "max"])
        for (gk, src, dst), part in rows.groupby(["group", "src", "dst"], sort=True):
            gk, src, dst = int(gk), int(src), int(dst)
            sends = part[(part["kind"] == "send") & (part["rank"] == src)].sort_values(["seq", "created_ns"])
            recvs = part[(part["kind"] == "recv") & (part["rank"] == dst)].sort_values(["seq", "created_ns"])
            mode = "order" if gk in by_order else "p2p_seq_id"
            why: list[str] = []
            if mode == "p2p_seq_id":
                s = sends.assign(nth=sends.groupby("seq").cumcount()).reset_index(drop=True)
                r = recvs.assign(nth=recvs.groupby("seq").cumcount()).reset_index(drop=True)
                m = s.reset_index().merge(r.reset_index(), on=["seq", "nth"], suffixes=("_s", "_r"))
                pair = _paired(s.loc[m["index_s"]], r.loc[m["index_r"]])
                lost_s, lost_r = s.drop(index=m["index_s"]), r.drop(index=m["index_r"])
                for lost, peer, side in ((lost_s, dst, "send"), (lost_r, src, "recv")):
                    if len(lost):
                        why.append(_why_unmatched(lost["seq"].to_numpy(), side, peer, gk, span, have))
            elif len(sends) == len(recvs):
                pair, lost_s, lost_r = _paired(sends, recvs), sends.iloc[:0], recvs.iloc[:0]
            else:
                pair, lost_s, lost_r = _paired(sends.iloc[:0], recvs.iloc[:0]), sends, recvs
                missing = [x for x in (src, dst) if x not in have]
                why.append(
                    f"{len(sends)} send(s) on rank {src}, {len(recvs)} recv(s) on rank {dst}: the set lacks rank "
                    f"{missing[0]}'s dump"
                    if missing
                    else f"{len(sends)} sends on rank {src} and {len(recvs)} recvs on rank {dst}: a rank of this "
                    "group has several peers in it, so p2p_seq_id (one counter per group and rank) cannot align "
                    "the two sides, and unequal counts leave the alignment unknown (a ring buffer wrapped, or "
                    "an op in flight); none matched"
                )
            pairs.append(
                P2PPair(
                    group=group_list[gk],
                    src=src,
                    dst=dst,
                    by=mode,
                    matched=len(pair),
                    size_mismatch=int((pair["numel"] != pair["recv_numel"]).sum()),
                    unmatched_sends=tuple(int(x) for x in lost_s["seq"]),
                    unmatched_recvs=tuple(int(x) for x in lost_r["seq"]),
                    why=tuple(why),
                )
            )
            matches.append(pair.assign(group=gk, src=src, dst=dst).drop(columns="recv_numel"))
    table = (
        pd.concat(matches, ignore_index=True)[list(_MATCH_COLUMNS)]
        if matches
        else pd.DataFrame({c: np.empty(0, bool if c == "finished" else np.int64) for c in _MATCH_COLUMNS})
    )
    return P2PReport(pairs=pairs, matches=table, other=other)


def _why_unmatched(
    seqs: np.ndarray, side: str, peer: int, group: int, span: pd.DataFrame, have: set[int]
) -> str:
    """Why ops of one side (``side`` on this rank, ``peer`` the other side) found no partner."""
    other = "recv" if side == "send" else "send"
    if peer not in have:
        return f"{len(seqs)} {side}(s) whose {other} would be in rank {peer}'s dump, which the set lacks"
    if (group, peer) not in span.index:
        return f"{len(seqs)} {side}(s): rank {peer} recorded no p2p op on this group"
    lo, hi = (int(v) for v in span.loc[(group, peer), ["min", "max"]])
    parts = []
    before, after = int((seqs < lo).sum()), int((seqs > hi).sum())
    inside = len(seqs) - before - after
    if before:
        parts.append(
            f"{before} {side}(s) before rank {peer}'s oldest recorded p2p op #{lo} (its ring buffer wrapped)"
        )
    if after:
        parts.append(
            f"{after} {side}(s) after rank {peer}'s newest #{hi} (posted after it dumped, or in flight)"
        )
    if inside:
        parts.append(
            f"{inside} {side}(s) inside rank {peer}'s recorded range #{lo}-#{hi} with no {other} there (a desync)"
        )
    return "; ".join(parts)


# --------------------------------------------------------------------------------------- the import
@dataclass
class FlightRecorderReport:
    """How a dump set was imported (what ``python -m pacectl.traces info`` prints).

    Attributes:
        files: the dump files, in rank order.
        ranks: their ranks.
        versions: format versions found.
        formats: ``pickle`` and/or ``json``.
        backends: communication backends named in the entries (``gloo``, ``nccl``).
        groups: the process groups.
        status: the per-group status (:func:`hang_report`).
        hang: why the set is a hang snapshot, or None.
        assembly: the import's own report (layout, timing, steps:
            :class:`~pacectl.traces.collectives.AssemblyReport`), None for a hang snapshot.
        p2p: the point-to-point matching (:func:`match_p2p`); reported only, not replayed.
    """

    files: list[str]
    ranks: list[int]
    versions: list[str]
    formats: list[str]
    backends: list[str]
    groups: list[Group]
    status: list[GroupStatus]
    hang: str | None
    assembly: Any = None
    p2p: P2PReport | None = None

    def summary(self) -> dict[str, Any]:
        """Plain values for ``info --json``."""
        return {
            "files": self.files,
            "ranks": self.ranks,
            "world_size": max(self.ranks) + 1 if self.ranks else 0,
            "versions": self.versions,
            "formats": self.formats,
            "backends": self.backends,
            "process_groups": [g.summary() for g in self.groups],
            "hang_snapshot": self.hang,
            "status": [
                {
                    "group": s.group.label,
                    "ranks": list(s.group.ranks),
                    "last_enqueued": list(s.last_enqueued),
                    "last_started": list(s.last_started),
                    "last_completed": list(s.last_completed),
                    "oldest_unfinished": s.oldest_unfinished,
                    "waiting": list(s.waiting),
                    "behind": list(s.behind),
                    "missing_dumps": list(s.missing_dumps),
                }
                for s in self.status
            ],
            "assembly": self.assembly.summary() if self.assembly is not None else None,
            "p2p": self.p2p.summary() if self.p2p is not None else None,
        }


def inspect_flight_recorder(
    paths: str | Path | Sequence[str | Path],
    *,
    ranks: Sequence[int] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_ops: int = DEFAULT_MAX_OPS,
) -> tuple[list[RankDump], FlightRecorderReport]:
    """Read a dump set and report its groups and where each rank stands, without building a trace
    (``info`` on a hang snapshot)."""
    dumps = read_dumps(paths, ranks=ranks, max_bytes=max_bytes, max_ops=max_ops)
    groups, index = process_groups(dumps)
    status = hang_report(dumps)
    report = FlightRecorderReport(
        files=[str(d.path) for d in dumps],
        ranks=[d.rank for d in dumps],
        versions=sorted({d.version for d in dumps}),
        formats=sorted({d.fmt for d in dumps}),
        backends=sorted({str(b) for d in dumps for b in d.entries["backend"].unique() if str(b)}),
        groups=groups,
        status=status,
        hang=is_hang_snapshot(dumps, status),
        p2p=match_p2p(dumps, (groups, index)),
    )
    return dumps, report


#: what ``all_gathers`` may be (see :func:`import_flight_recorder`)
ALL_GATHERS = ("fold", "sync")


def import_flight_recorder(
    paths: str | Path | Sequence[str | Path],
    *,
    ranks: Sequence[int] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_ops: int = DEFAULT_MAX_OPS,
    layout: LayoutOverrides | None = None,
    timing: str = "auto",
    collective_s: float | None = None,
    collective_frac: float = 0.01,
    name: str | None = None,
    all_gathers: str = "fold",
) -> tuple[OpTrace, FlightRecorderReport]:
    """Import a set of Flight Recorder dumps (one per rank) into a canonical :class:`OpTrace`.

    Args:
        paths: dump files, a folder of them, or a glob (see :func:`resolve_dump_paths`).
        ranks: the rank of each file, in sorted-path order (default: from the file names).
        max_bytes: cap on each file's size, bytes (``trace.max_mb``).
        max_ops: cap on the entries of the set, checked as each file is read, and on the ops of the
            trace, checked before it is built (``trace.max_ops``).
        layout: layout overrides (see :class:`~pacectl.traces.collectives.LayoutOverrides`).
        timing: ``"auto"`` (durations when every gradient collective has one), ``"duration"``
            or ``"created"`` (see :func:`~pacectl.traces.collectives.assemble`).
        collective_s: transfer time of a collective when the dumps record no duration, s
            (None: ``collective_frac`` of the median step period).
        collective_frac: that fraction, in [0, 1].
        name: job name (default: the folder's name).
        all_gathers: ``"fold"``: the DP groups' all-gathers fold into compute; ``"sync"``: they are
            step collectives like the gradient ones (an FSDP job: the early ranks wait for a
            straggler before forward in the forward's first parameter all-gather, which FSDP2's
            pacer paces by default; folded, that wait reads as compute and the straggler is lost).

    Returns:
        ``(trace, report)`` with ``trace.fmt == "flight_recorder"``.

    Raises:
        TraceError: a file cannot be read (see :func:`read_dump`), the set or its trace passes
            ``max_ops``, the set is a hang snapshot (the message names the group and ranks behind and
            the settings that make replayable dumps), or the layout or steps cannot be inferred.

    Example:
        >>> from pacectl.data import DATA_DIR
        >>> trace, report = import_flight_recorder(DATA_DIR / "flight-recorder" / "ddp2")
        >>> trace.meta.dp_size, report.assembly.timing
        (2, 'created')
    """
    if all_gathers not in ALL_GATHERS:
        raise TraceError(f"trace.all_gathers must be one of {list(ALL_GATHERS)}, got {all_gathers!r}")
    dumps, report = inspect_flight_recorder(paths, ranks=ranks, max_bytes=max_bytes, max_ops=max_ops)
    src = str(dumps[0].path.parent) if len({d.path.parent for d in dumps}) == 1 else "; ".join(report.files)
    if report.hang is not None:
        raise TraceError(
            f"a replayable Flight Recorder dump set must record finished steps, got a hang snapshot: "
            f"{report.hang} (in {src}). See who is behind with `python -m pacectl.traces info {src}`; for "
            f"replayable dumps set {REPLAYABLE_ENV}"
        )
    coll, groups = collective_set(dumps, source=src)
    trace, assembly = assemble(
        coll,
        groups,
        source=src,
        fmt="flight_recorder",
        name=name or (dumps[0].path.parent.name or "flight_recorder"),
        layout=layout,
        timing=timing,
        collective_s=collective_s,
        collective_frac=collective_frac,
        sync_kinds=("all_gather",) if all_gathers == "sync" else (),
        warning=FlightRecorderWarning,
        max_ops=max_ops,
    )
    report.assembly = assembly
    p2p = report.p2p
    if p2p is not None and (p2p.unmatched or p2p.other):
        other = f", and p2p entries not matchable: {p2p.other}" if p2p.other else ""
        warnings.warn(
            f"{src}: {p2p.unmatched} point-to-point op(s) unmatched (of {2 * p2p.matched + p2p.unmatched} sends "
            f"and recvs){other}; `python -m pacectl.traces info {src}` lists them per pair (the replay folds "
            "p2p ops into compute)",
            FlightRecorderWarning,
            stacklevel=2,
        )
    return trace, report


def load_flight_recorder(paths: str | Path | Sequence[str | Path], **kwargs: Any) -> OpTrace:
    """Like :func:`import_flight_recorder`, returning only the trace."""
    return import_flight_recorder(paths, **kwargs)[0]
