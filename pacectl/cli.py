"""The entry points' command line (``pacectl.run``, ``pacectl.tune``): a user mistake costs one
line, exit status 2, and nothing on disk.

:func:`main` owns the command line of a plain run: it composes the overrides with Hydra's compose
API and checks them (:func:`check_command_line`: a composition error becomes one line with a
did-you-mean, the composed config goes through the entry point's own checks), checks that the run
folder can be written (:func:`run_dir_error`), and only then runs the job (:func:`run_job`: its
outputs are staged, so a failed job leaves no folder behind). Hydra writes nothing into the run
folder (``hydra.output_subdir: null``; its job logging is the console only). ``-m``/``--multirun``
(a sweep, through any Hydra launcher) and Hydra's own flags (``--help``, ``--cfg``, ...) go through
``@hydra.main``, after the same checks (every job of a sweep).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import math
import os
import re
import shlex
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from pacectl.errors import ConfigError, PacectlError, config_error, did_you_mean, dotted, one_line_warnings
from pacectl.files import folder_problem, staged_outputs

#: A job: ``job(cfg, out_dir)`` runs the composed config (without Hydra's section) and writes its
#: outputs into ``out_dir``; it raises :class:`~pacectl.errors.PacectlError` for a user mistake.
Job = Callable[[DictConfig, Path], None]
#: How the job log stamps the console lines.
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def main(
    prog: str,
    config_dir: Path,
    config_name: str,
    job: Job,
    *,
    validate: Callable[[DictConfig], None] | None = None,
    argv: Sequence[str] | None = None,
) -> int:
    """Run an entry point's command line ``argv`` (None: this process's) and return its exit status.

    Args:
        prog: the program name (``pacectl.run``), which starts every error line.
        config_dir: the config folder (``conf/``).
        config_name: the primary config (``config`` or ``tune``).
        job: the work of one run (see :data:`Job`).
        validate: the entry point's checks of a composed config (see :func:`check_command_line`).
        argv: the arguments, without the program name.

    Returns:
        0, 2 for a user mistake (one line on stderr). A reader that goes away is not a failure
        (``--help | head -1`` exits 0, as ``pacectl.traces`` does, and a run whose console is cut off
        still writes its outputs and exits 0); 1 only for a job that a print into a closed pipe cut
        short, since its outputs were not written.
        A ``KeyboardInterrupt`` propagates, once the run folder is cleaned up.
    """

    def body() -> None:
        args = sys.argv[1:]
        try:
            # the formats (ConfigStore) and presets, read only for a trace= argument
            given = any(a.partition("=")[0] == "trace" for a in args)
            options = list(group_nodes(config_dir, "trace")) if given else []
            args, notes = expand_trace_file(args, options)
        except ConfigError as err:
            _fail(prog, str(err))
        for note in notes:
            print(f"{prog}: {note}", file=sys.stderr)
        cfg = check_command_line(prog, config_dir, config_name, validate, argv=args)
        if cfg is not None and not _multirun(cfg):
            try:
                _run_here(prog, cfg, job)
            except BrokenPipeError:  # a print (not a log line: ConsoleHandler) into a closed pipe
                quiet_broken_pipe()
                sys.exit(1)
            return
        if cfg is not None:  # a sweep: its folder must be writable before Hydra creates it
            problem = run_dir_error(cfg)
            if problem:
                _fail(prog, problem)
        import hydra

        sys.argv[1:] = args
        task = hydra.main(version_base="1.3", config_path=str(config_dir), config_name=config_name)
        try:
            task(lambda job_cfg: run_job(prog, job_cfg, job))()
        except BrokenPipeError:  # --help | head: the reader took what it wanted; not an error
            quiet_broken_pipe()
            sys.exit(0)

    return invoke(prog, argv, body)


def _multirun(cfg: DictConfig) -> bool:
    from hydra.types import RunMode

    return bool(cfg.hydra.mode == RunMode.MULTIRUN)


def _fail(prog: str, line: str) -> None:
    print(f"{prog}: error: {line}", file=sys.stderr)
    sys.exit(2)


def _run_here(prog: str, cfg: DictConfig, job: Job) -> None:
    """A plain run, composed here: Hydra's runtime config as Hydra would set it, then the job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import configure_log, env_override

    with contextlib.suppress(OmegaConfBaseException), open_dict(cfg):  # ${now:...} resolved once
        cfg.hydra.run.dir = str(cfg.hydra.run.dir)
    problem = run_dir_error(cfg)
    if problem:
        _fail(prog, problem)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(Path(cfg.hydra.run.dir).absolute())
    HydraConfig.instance().set_config(cfg)
    configure_log(cfg.hydra.job_logging, cfg.hydra.verbose)
    task = cfg.copy()
    with open_dict(task):
        del task["hydra"]
    with env_override(dict(cfg.hydra.job.env_set)):
        run_job(prog, task, job)


def run_job(prog: str, cfg: DictConfig, job: Job) -> None:
    """Run ``job`` in the run folder of Hydra's runtime config; keep its log and config on success.

    The folder is created and locked for the job (:func:`lock_run_dir`), so a second run into it is
    refused while this one runs. The console lines are also filed, stamped, in ``<job name>.log``
    (appended to an earlier one: a rerun into the folder), and the composed config in
    ``config.yaml`` (its first line the command, :func:`job_overrides`): both are staged and moved in only when
    the job succeeds. A job that fails removes the folders of its path that it found missing or
    empty (Hydra creates a sweep job's folder before the job starts) while nothing is in them.
    """
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    new = [p for p in (out_dir, *out_dir.parents) if not p.exists()]
    if not new and not any(out_dir.iterdir()):
        new = [out_dir]
    problem = lock_run_dir(out_dir)  # creates it: removed again if the job fails
    if problem:
        _fail(prog, problem)
    one_line_warnings(newline=False)
    logging.captureWarnings(True)  # Python warnings as log lines: the console and the job log
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    log_name = f"{hc.job.name}.log"
    try:
        try:
            job(cfg, out_dir)
        except ConfigError as err:
            _fail(prog, f"{sweep_job_prefix()}{set_in_file(err, list(hc.overrides.task))}")
        except PacectlError as err:
            _fail(prog, f"{sweep_job_prefix()}{err}")
        with staged_outputs(out_dir, append=[log_name]) as stage:
            (stage / log_name).write_text(lines.getvalue(), encoding="utf-8")
            command = shlex.join(["python", "-m", prog, *(str(o) for o in hc.overrides.task)])
            (stage / "config.yaml").write_text(f"# {command}\n{OmegaConf.to_yaml(cfg)}", encoding="utf-8")
    except BaseException as end:
        if isinstance(end, Interrupted):  # what it wrote stays: so do its log lines
            with staged_outputs(out_dir, append=[log_name]) as stage:
                (stage / log_name).write_text(lines.getvalue(), encoding="utf-8")
        for folder in new:  # deepest first
            with contextlib.suppress(OSError):
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
        raise
    finally:
        root.removeHandler(handler)
        release_run_dirs()


def job_overrides(job_dir: Path) -> list[str]:
    """The command-line overrides of the job whose outputs are in ``job_dir`` (a sweep job's folder):
    the command on the first line of its ``config.yaml`` (:func:`run_job`)."""
    first = (job_dir / "config.yaml").read_text(encoding="utf-8").partition("\n")[0]
    return shlex.split(first.removeprefix("# "))[3:]


class Interrupted(SystemExit):
    """A job interrupted after writing what stays (a study's finished trials): exit status 130, and
    :func:`run_job` keeps the job's log lines with it."""

    def __init__(self) -> None:
        super().__init__(130)


def release_run_dirs() -> None:
    """Release the run folders this process locked (:func:`lock_run_dir`): a run in the same process
    (an in-process command, a test) may use the folder next."""
    while _locks:
        with contextlib.suppress(OSError):
            os.close(_locks.pop())


#: The open, locked run folders of this process (the kernel releases them when it exits).
_locks: list[int] = []


def lock_run_dir(run_dir: Path) -> str | None:
    """Take an exclusive lock on ``run_dir`` (created if missing) until :func:`release_run_dirs`.

    A second run into the folder is refused while the first runs (its outputs would mix). The lock is
    ``flock`` on the folder itself: no lock file is left, and the kernel releases it when the process dies.

    Returns:
        None when locked (or when locking is not possible here: no ``fcntl``), else the error line.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir.absolute(), os.O_RDONLY)
    except OSError:
        return None  # the job's first write reports an unusable folder
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return (
            f"the run folder {run_dir.absolute()} must not be in use by another run, got one running in it "
            "now; wait for it to end or choose another hydra.run.dir (hydra.sweep.dir for -m)"
        )
    _locks.append(fd)
    return None


def invoke(prog: str, argv: Sequence[str] | None, body: Callable[[], None]) -> int:
    """Run an entry point's ``body`` with ``argv`` as its command line, and return its exit status.

    ``body`` reads ``sys.argv`` (Hydra does) and may end in ``sys.exit``; here that becomes the
    returned status, so that a caller in the same process (a test) gets the status, not SystemExit.
    Afterwards the process is as before: ``sys.argv``, Hydra's global state (so that the compose API
    and a next run can start afresh), logging, the warnings format and ``logging.captureWarnings``.

    Args:
        prog: the program name (``sys.argv[0]``: Hydra's argument errors name it).
        argv: the arguments; None: this process's own (``sys.argv[1:]``).
        body: the entry point's work.
    """
    import signal

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    saved_argv, saved_format, saved_sigint = sys.argv, warnings.formatwarning, signal.getsignal(signal.SIGINT)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    sys.argv = [prog, *(sys.argv[1:] if argv is None else argv)]
    try:
        body()
        return 0
    except SystemExit as end:
        if end.code is None or isinstance(end.code, int):
            return int(end.code or 0)
        print(end.code, file=sys.stderr)
        return 1
    finally:
        release_run_dirs()  # the next in-process run may use the same folder
        sys.argv, warnings.formatwarning = saved_argv, saved_format
        if saved_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, saved_sigint)  # a Ctrl-C handler set for the run (pacectl.tune)
        logging.captureWarnings(False)
        for handler in root.handlers:  # the job's console handlers go
            if handler not in saved_handlers:
                handler.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None  # type: ignore[assignment]


def sweep_job_prefix() -> str:
    """``"sweep job #N (its overrides): "`` inside a Hydra ``--multirun`` job, else ``""``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return ""
    hc = HydraConfig.get()
    return f"sweep job #{hc.job.num} ({' '.join(str(o) for o in hc.overrides.task)}): "


class BelowLevel(logging.Filter):
    """Logging filter passing records below ``level``: the console's stdout handler leaves warnings
    to its stderr twin (``conf/hydra/job_logging/pacectl.yaml``)."""

    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < self.level


class ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The console's handlers (``conf/hydra/job_logging/pacectl.yaml``): a stream handler that, when
    its reader has gone (``python -m pacectl.run | head -1``: a ``BrokenPipeError``), points the
    stream at /dev/null and carries on quietly, instead of logging's ``--- Logging error ---`` and a
    traceback for every later line. The job runs to its end and writes its outputs as it would
    have; only its console lines are lost (Python's docs, signal module, 'Note on SIGPIPE')."""

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            quiet_broken_pipe(self.stream)
            return
        super().handleError(record)


#: Free bytes below which a run is refused before it starts (its outputs and the log).
MIN_FREE_BYTES = 1 << 20


def run_dir_error(cfg: DictConfig, *, min_free_bytes: int = MIN_FREE_BYTES) -> str | None:
    """Why the run folder of a composed config (``hydra.run.dir``; ``hydra.sweep.dir`` for ``-m``)
    cannot be created or written, or None.

    Checked without leaving anything behind (:func:`pacectl.files.folder_problem`): no part of the
    path may be a file, the deepest existing folder must accept new ones, and its file system must
    have ``min_free_bytes`` free (a full disk would end in an ``OSError`` at the first write).

    Args:
        cfg: the composed config, with Hydra's section (``return_hydra_config=True``).
    """
    key = "hydra.sweep.dir" if _multirun(cfg) else "hydra.run.dir"
    try:
        value = str(OmegaConf.select(cfg, key))
    except OmegaConfBaseException as err:  # ${oc.env:UNSET}/x
        return f"{key} must resolve to a folder, got: {str(err).splitlines()[0]}"
    # every value given for it (the last one wins, but a folder that is a file is a mistake anyway)
    given = [o.partition("=")[2] for o in map(str, cfg.hydra.overrides.hydra) if o.partition("=")[0] == key]
    for text in [*(v for v in given if "${" not in v), value]:
        if not text.strip("'\" "):
            return (
                f"{key} must name a folder, got an empty value (the outputs would land in the current folder)"
            )
        problem = folder_problem(Path(text.strip("'\"")).absolute())  # Hydra does not expand ~: nor does this
        if problem and not given:
            default = "multirun" if key == "hydra.sweep.dir" else "outputs"
            return (
                f"the default run folder ({default}/... in the current folder) cannot be created: {problem}; "
                f"set {key}=<a writable folder>"
            )
        if problem and problem.endswith("is a file, not a folder"):
            where = problem.removesuffix(" is a file, not a folder")
            return f"{key} must be a folder (new or existing), but {where} is a file; pick another path"
        if problem:
            return f"{key}={text}: {problem}; pick a folder you can write to"
    return no_room_error(Path(value), min_free_bytes=min_free_bytes)


def no_room_error(path: Path, *, min_free_bytes: int = MIN_FREE_BYTES) -> str | None:
    """The error for a run folder ``path`` on a file system with less than ``min_free_bytes`` free
    (its nearest existing folder is the one checked), or None."""
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free < min_free_bytes:
        return (
            f"the run folder's file system must have room to write, got {free} bytes free at {path}; "
            "free some space or point hydra.run.dir (hydra.sweep.dir for -m) at another disk"
        )
    return None


def hydra_value(text: str) -> str:
    """``text`` as one Hydra override value that parses back to this very string: bare where the
    grammar reads it so (ASCII path characters, and not a number, bool or null), else quoted."""
    if re.fullmatch(r"[A-Za-z0-9_./*+-]+", text) and _parses_to(text, text):
        return text
    # in a quoted string only a quote, and backslashes right before a quote or the end, are escaped
    body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    body = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body)
    return f"'{body}'"


def _parses_to(value_text: str, expected: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_override(f"k={value_text}").value() == expected
    except Exception:  # noqa: BLE001 - any grammar error: not this text
        return False


def trace_file_format(value: str, options: Sequence[str] = ()) -> tuple[str | None, Path | None]:
    """``(format, meta)`` for a ``trace=`` value that names a path rather than an option, else
    ``(None, None)``.

    The rule is :func:`pacectl.traces.detect.detect_format`'s (a folder, glob, ``.json``/
    ``.json.gz`` -> ``kineto``; ``.csv`` -> ``steplevel``; ``.parquet`` -> ``canonical``, or
    ``bytedance`` with the ``meta-X.yaml`` found beside ``trace-X.parquet``). A value that is one
    of ``options`` (``conf/trace/*.yaml``) stays an option; a plain name (letters, digits, ``-``,
    ``_``) is a path only when it is an existing folder.
    """
    from pacectl.traces.detect import detect_format

    value = value.strip().strip("'\"")
    if not value or value in options:
        return None, None
    if re.fullmatch(r"[\w-]+", value) and not Path(value).is_dir():
        return None, None
    return detect_format(Path(value).expanduser())


def expand_trace_file(args: Sequence[str], options: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """``trace=<file>`` -> ``trace=<format> trace.path=<file>`` (see :func:`trace_file_format`).

    A ByteDance trace also gets ``trace.meta=`` (its meta YAML beside it). A sweep of files
    (``-m trace=a.parquet,b.parquet``) becomes a sweep of ``trace.path`` when every file has the
    same format and needs no meta file; any other comma list is left to Hydra and
    :func:`composition_error`. Values the override grammar does not allow bare (spaces,
    brackets, quotes) are quoted.

    Args:
        args: the command line's arguments.
        options: the ``trace`` group's option names (they are never read as paths).

    Returns:
        ``(args, notes)``: the arguments with each such shorthand expanded in place (a later
        ``trace.path=`` on the command line still wins), and one note per expansion for the user.

    Raises:
        ConfigError: a sweep of files of more than one format.
    """
    out: list[str] = []
    notes: list[str] = []
    multirun = any(a in ("-m", "--multirun") for a in args)
    for a in args:
        key, eq, value = a.partition("=")
        items = [v.strip().strip("'\"") for v in value.split(",")] if eq and key == "trace" else []
        if len(items) > 1 and not multirun:
            items = []  # a comma list without -m: Hydra's own error
        found = [trace_file_format(v, options) for v in items]
        formats = {fmt for fmt, _ in found}
        if len(formats - {None}) > 1:
            by_format = ", ".join(f"{v} ({fmt})" for v, (fmt, _) in zip(items, found, strict=True) if fmt)
            raise ConfigError(
                f"{a}: a sweep of trace files must be of one format, got {by_format}: "
                "sweep each format in its own -m run"
            )
        if not found or None in formats or len(formats) > 1 or (len(found) > 1 and formats == {"bytedance"}):
            out.append(a)
            continue
        fmt = formats.pop()
        paths = [str(Path(v).expanduser()) for v in items]  # ~ is the shell's, which left it here
        expanded = [f"trace={fmt}", "trace.path=" + ",".join(hydra_value(v) for v in paths)]
        meta = found[0][1]
        if len(found) == 1 and meta is not None:
            expanded.append(f"trace.meta={hydra_value(str(meta))}")
        out += expanded
        notes.append(f"{a} read as {' '.join(expanded)}")
    return out, notes


def quiet_broken_pipe(stream: Any = None) -> None:
    """After a ``BrokenPipeError`` on ``stream`` (default stdout; ``--help | head``): no traceback,
    the caller picks the exit status. Points the stream's file descriptor at /dev/null so that
    later writes and the interpreter's final flush cannot fail again."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no file descriptor (a StringIO)
        fd = (sys.stdout if stream is None else stream).fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)


def composition_error(config_dir: Path, config_name: str, overrides: list[str], err: Exception) -> str:
    """One line for a Hydra composition error of ``overrides``, with a did-you-mean where one fits.

    Args:
        config_dir: the config folder (``conf/``).
        config_name: the primary config (``config`` or ``tune``).
        overrides: the command-line overrides that failed to compose.
        err: Hydra's exception (``ConfigCompositionException``, ``MissingConfigException``,
            ``OverrideParseException``).
    """
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigIndexError, ConfigKeyError, ValidationError

    cause = err.__cause__
    path = dotted(getattr(cause, "full_key", "") or "")
    listed, _, index = path.rpartition(".")
    if isinstance(cause, ConfigIndexError | ValidationError) and index.isdigit():  # cluster.jobs.5.ranks=...
        text = next((o for o in overrides if _is_under(o.lstrip("+").partition("=")[0], path)), path)
        node = _compose_without(config_dir, config_name, overrides, text.partition("=")[0])
        items = OmegaConf.select(node, listed) if node is not None else None
        if isinstance(items, ListConfig) and int(index) >= len(items):  # (a typed list: a ValidationError)
            have = f"{listed}.0 to {listed}.{len(items) - 1}" if len(items) else "none"
            return f"{text}: {listed} has {len(items)} entries ({have}), so there is no {path}"
    if isinstance(cause, ValidationError):  # a wrong type for a typed config
        return config_error(cause)
    # a group option that does not exist; Hydra lists them
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options is not None:
        missing, available = err.missing_cfg_file, list(err.options)
        groups = [
            k for k in (o.partition("=")[0].lstrip("+") for o in overrides) if missing.startswith(f"{k}/")
        ]
        group = max(groups, key=len) if groups else missing.rpartition("/")[0]  # the option may hold a /
        option = missing[len(group) + 1 :]
        if not option:
            return f"{group}= needs an option of the {group} group: one of {', '.join(available)}"
        hint = did_you_mean(option, available)
        fix = f" Did you mean {group}={hint}?" if hint else ""
        if group == "trace" and (not re.fullmatch(r"[\w-]+", option) or Path(option).is_dir()):
            from pacectl.traces.detect import SUFFIX_FORMATS, other_traces_in

            fix = (
                " A file given as trace=<file> must end in "
                + ", ".join(f"{suf} ({fmt})" for suf, fmt in SUFFIX_FORMATS)
                + " or be a folder or glob of Kineto files (a sweep: files of one format); else name "
                "its format, e.g. trace=bytedance trace.path=<file> trace.meta=<meta.yaml>"
            )
            folder = Path(option.strip("'\""))
            held = other_traces_in(folder)
            if held:  # e.g. a live run's records/ folder
                fix = f" It is a folder of {', '.join(held[:4])}: name one, e.g. trace={folder / held[0]}"
            elif folder.is_dir():
                return (
                    f"trace={option}: the folder holds no trace: a folder stands for Kineto rank files "
                    "(*.json or *.json.gz) and has none. Point trace= at the trace file or rank files"
                )
            elif "," in option:
                fix += (
                    " (a sweep of ByteDance traces is not expanded: each needs its own trace.meta; "
                    "run them one by one)"
                )
        return f"{group}={option}: no such option of {group} (available: {', '.join(available)}).{fix}"
    key = missing_key(err, overrides)
    if key:
        given = next((o.partition("=")[2] for o in overrides if o.partition("=")[0] == key), "...")
        parent, _, leaf = key.rpartition(".")
        node = _compose_without(config_dir, config_name, overrides, key)
        section = OmegaConf.select(node, parent) if node is not None and parent else node
        known = sorted(str(k) for k in section.keys()) if isinstance(section, DictConfig) else []
        where = f"{parent}." if parent else ""
        hint = did_you_mean(leaf, known)
        fix = f" Did you mean {where}{hint}={given}?" if hint else ""
        owners = _options_with_key(config_dir, parent, leaf)
        if hint and leaf not in owners.values():
            owners = {}  # a typo of a key here (kpp -> kp); the exact key elsewhere would beat it
        if owners:  # a key of another option of the group (backend.num_ranks needs backend=sim;
            # record_dir is a key of backend=torch, not a typo of the sim's record)
            group = parent.partition(".")[0]
            option, real = next(iter(owners.items()))
            named = ", ".join(f"{group}={o}" for o in owners)
            typo = f" Did you mean {parent}.{real}?" if real != leaf else ""
            fix = f"{typo} It is a key of {named}: select one, e.g. {group}={option} {parent}.{real}={given}"
        controller_file = next(
            (o.partition("=")[2] for o in overrides if o.startswith("controller_file=")), None
        )
        if parent == "controller" and controller_file:
            return (
                f"{key}={given}: controller_file={controller_file} sets the controller (the file's values "
                f"replace the controller group, so controller.* overrides are not read); change {leaf} in "
                "that file, or drop controller_file to set it here"
            )
        if parent == "controller" and isinstance(section, DictConfig) and section.get("name") == "all":
            return (
                f"{key}: controller=all (the default) runs every family with its own defaults "
                f"and takes no parameters; pick one family to set them."
                + (fix or " python -m pacectl.run --help lists each family's keys")
            )
        # (no "add it with +key" hint: pacectl reads only the keys its configs have, and refuses others)
        # the known keys: under a section; at the top level only when no near key is suggested
        shown = (
            f" (known under {parent}: {known})" if parent else ("" if hint else f" (top-level keys: {known})")
        )
        if not known and isinstance(node, DictConfig):
            top = sorted(str(k) for k in node.keys())
            first = key.split(".")[0]
            if first in top:  # seed.x: the parent is a value, not a section
                shown = f" ({parent} is a value, not a section with keys)"
            else:  # the section itself does not exist (tun.n_trials)
                close = did_you_mean(first, top)
                fix = fix or (f" Did you mean {close}{key[len(first) :]}={given}?" if close else "")
                shown = f" (top-level keys: {top})"
        return f"{key}={given}: no such config key{shown}.{fix}"
    if isinstance(err.__cause__, ConfigKeyError):  # a mapping given a key its typed node lacks
        return config_error(err.__cause__)
    if err.__cause__ is None and isinstance(err.__context__, ConfigKeyError | ValidationError):
        # raised while Hydra merged a config file (a profile's YAML) into its typed node
        line = config_error(err.__context__)
        if ".<i>." in line:  # a profile's job entry, checked without its index
            from pacectl.config import job_entry_error

            line = job_entry_error(lambda: _compose(config_dir, config_name, overrides)) or line
        return f"{line} ({in_file(line.partition('.')[0], overrides)})"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    line = " ".join(lines[:4])
    grammar = "https://hydra.cc/docs/advanced/override_grammar/basic/"
    return line if "https://" in line else f"{line} (see {grammar})"


def in_file(group: str, overrides: Sequence[str]) -> str:
    """Where a value no override set comes from: ``in the YAML of cluster=badjob, not an override:
    fix the file`` (the group's option on the command line), or a config file of this command."""
    option = next((o.partition("=")[2] for o in overrides if o.partition("=")[0] == group), None)
    where = f"the YAML of {group}={option}" if option else "a config file of this command"
    return f"in {where}, not an override: fix the file"


def set_in_file(err: ConfigError, overrides: Sequence[str]) -> str:
    """``err``'s line; for a value out of range that a config file set, the file in place of the
    override its line suggests. An override sets the key when it names it, or when its value is a
    list or mapping above it that holds it (Hydra replaces a list and merges a mapping);
    ``cluster=badjob`` above ``cluster.jobs.2.start_s`` only picks a file."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if err.key is None or not err.hint:
        return str(err)
    for o in overrides:
        key = o.lstrip("+").partition("=")[0]
        if key == err.key:
            return str(err)
        if not _is_under(err.key, key):
            continue
        try:
            node: Any = OverridesParser.create().parse_overrides([o])[0].value()
        except HydraException:
            continue
        if not isinstance(node, list | dict):
            continue  # a group's option: its file sets the value
        for part in err.key[len(key) + 1 :].split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                break
        else:
            return str(err)  # the key is in the override's value
    return str(err).replace(err.hint, in_file(err.key.partition(".")[0], overrides))


def missing_key(err: Exception, overrides: Sequence[str]) -> str | None:
    """The key of the override in ``overrides`` that Hydra could not set because the config has no
    such key (``controller.kpp=1``, ``tun.n_trials=3``), from the OmegaConf error Hydra chains, or None."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    cause = err.__cause__
    if not isinstance(cause, ConfigAttributeError | ConfigKeyError) or not cause.full_key:
        return None
    keys = [o.partition("=")[0] for o in overrides if "=" in o and not o.startswith(("+", "~"))]
    full = dotted(cause.full_key)
    return next((k for k in keys if k == full or k.startswith(f"{full}.")), None)


def _is_under(key: str, path: str) -> bool:
    """Whether the dotted ``key`` is ``path`` or below it (``cluster.jobs.1.x`` is under
    ``cluster.jobs.1``; ``cluster.jobs.10.x`` is not)."""
    return key == path or key.startswith(path + ".")


def group_value_error(config_dir: Path, overrides: list[str]) -> str | None:
    """One line for a config group given something that is no option name, or None.

    A number, bool or null (``+backend=0.5``, ``trace=-1``) makes Hydra raise a bare ``ValueError``
    that names neither group nor value; a dict reads as "Could not override"; a list of numbers
    (``+analysis=[1,2]``) a ``TypeError``; an empty list (``backend=[]``) composes, selecting no
    option, and the run fails later.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    for text in overrides:
        try:
            parsed = OverridesParser.create().parse_override(text)
            value = parsed.value()
        except HydraException:
            continue  # worded with the composition's error
        if isinstance(value, str) or (
            isinstance(value, list) and value and all(isinstance(v, str) for v in value)
        ):
            continue  # an option, or a list of options
        group = parsed.key_or_group
        options = group_nodes(config_dir, group)
        if options:
            given = text.partition("=")[2]
            return f"{group}={given}: no such option of {group} (available: {', '.join(options)})."
    return None


def group_nodes(config_dir: Path, group: str) -> dict[str, Any]:
    """The options of the config group ``group`` and their nodes: the ``conf/<group>/*.yaml`` files
    and what is stored in Hydra's ConfigStore (the registered controller families), by name."""
    from hydra.core.config_store import ConfigStore

    nodes: dict[str, Any] = {}
    stored = ConfigStore.instance().repo.get(group, {})
    for name, entry in stored.items():
        if name.endswith(".yaml") and hasattr(entry, "node"):
            nodes[name.removesuffix(".yaml")] = entry.node
    folder = config_dir / group
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
        nodes[path.stem] = OmegaConf.load(path)
    return dict(sorted(nodes.items()))


def _options_with_key(config_dir: Path, parent: str, key: str) -> dict[str, str]:
    """Options of the config group that ``parent`` starts with (:func:`group_nodes`) that define
    ``key`` or a key close to it under the rest of ``parent`` (``backend.pacing``: the ``pacing``
    section of each backend): option -> that key. Empty when ``parent`` is not in a config group."""
    group, _, section = parent.partition(".")
    if not group:
        return {}
    found: dict[str, str] = {}
    for option, node in group_nodes(config_dir, group).items():
        if section and isinstance(node, DictConfig):
            node = OmegaConf.select(node, section)
        keys = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
        match = key if key in keys else did_you_mean(key, keys)
        if match:
            found.setdefault(option, match)
    exact = {option: k for option, k in found.items() if k == key}
    return exact or found


def _compose(config_dir: Path, config_name: str, overrides: list[str], *, hydra: bool = False) -> DictConfig:
    """Hydra's compose API on ``config_dir`` (raises Hydra's composition errors); with ``hydra``,
    Hydra's own section too (``hydra.run.dir``, the job logging, the overrides)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=hydra)


def _compose_without(config_dir: Path, config_name: str, overrides: list[str], key: str) -> DictConfig | None:
    rest = [o for o in overrides if o.partition("=")[0] != key]
    try:
        return _compose(config_dir, config_name, rest)
    except Exception:  # noqa: BLE001 - only for a hint: another override fails as well
        return None


#: A ``--multirun`` sweep is checked job by job before its first job runs, up to this many jobs;
#: a larger sweep is checked on as many jobs as its longest list of values, so that every value of
#: every swept key is checked once.
MAX_CHECKED_JOBS = 64
#: Hydra flags the pre-check understands: without an argument, and with one.
_FLAGS = {"-m", "--multirun", "-h", "--help", "--hydra-help", "-r", "--resolve"}
_FLAGS_WITH_ARG = {"-c", "--cfg", "-p", "--package"}


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]] | None:
    """The override lists of the jobs a Hydra ``--multirun`` sweep would run (its basic sweeper's
    cartesian product of ``key=a,b`` / ``range()`` values) and checks, at most
    :data:`MAX_CHECKED_JOBS` of them (see there), or None if the sweep cannot be expanded here
    (``glob()``, ``interval()``: then Hydra reports it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        choices: list[list[str]] = []
        for text, o in zip(overrides, OverridesParser.create().parse_overrides(list(overrides)), strict=True):
            if o.is_sweep_override():
                key = o.get_key_element()
                choices.append([f"{key}={v}" for v in o.sweep_string_iterator()])
            else:
                choices.append([text])
    except Exception:  # noqa: BLE001 - a sweep this check does not expand: Hydra reports it
        return None
    if math.prod(len(c) for c in choices) <= MAX_CHECKED_JOBS:
        return [list(job) for job in itertools.product(*choices)]
    return [[c[i % len(c)] for c in choices] for i in range(max(len(c) for c in choices))]


def check_command_line(
    prog: str,
    config_dir: Path,
    config_name: str,
    validate: Callable[[DictConfig], None] | None = None,
    argv: Sequence[str] | None = None,
) -> DictConfig | None:
    """Entry points, before Hydra starts: compose the overrides and check them; one line and exit 2.

    With ``-m``/``--multirun`` the jobs of the sweep are checked (see :data:`MAX_CHECKED_JOBS`), so
    a bad value in a late job stops the sweep before the first job runs. With ``--help`` or
    ``--cfg`` only the composition is checked; with another flag nothing (Hydra handles it).
    ``~key`` (removing a key) is refused: every key of the shipped configs is read.
    ``validate`` gets the composed config (without Hydra's runtime section) and raises a
    :class:`~pacectl.errors.PacectlError` for a value the job would refuse; its warnings are left
    to the job, which reports them in its own log.

    Returns:
        The composed config with Hydra's section (of the first job of a sweep, ``hydra.mode``
        ``MULTIRUN``), or None where a flag leaves the command to Hydra (``--help``, ``--cfg``).
    """
    from hydra.errors import HydraException

    args = list(sys.argv[1:] if argv is None else argv)
    flags, overrides = set(), []
    it = iter(args)
    for a in it:
        if a in _FLAGS_WITH_ARG:
            flags.add(a)
            next(it, None)
        elif a.startswith("-"):
            if a not in _FLAGS:
                return None
            flags.add(a)
        else:
            overrides.append(a)

    for o in overrides:
        if o.startswith("~"):
            key = o[1:].partition("=")[0]
            _fail(prog, f"{o}: removing config keys is not supported (every key is read); set {key} instead")
    multirun = bool(flags & {"-m", "--multirun"})
    jobs = sweep_jobs(overrides) if multirun else [overrides]
    inspect_only = bool(flags - {"-m", "--multirun"})
    first = None
    for job in jobs or []:
        where = f"sweep job ({' '.join(job)}): " if multirun else ""
        line = search_path_error(job) or group_value_error(config_dir, job)  # Hydra: a warning; no group
        if line:
            _fail(prog, where + line)
        try:
            cfg = _compose(config_dir, config_name, [*job, *["hydra.mode=MULTIRUN"][:multirun]], hydra=True)
        except HydraException as err:
            _fail(prog, where + composition_error(config_dir, config_name, job, err))
        first = cfg if first is None else first
        if validate is None or inspect_only:
            continue
        task = cfg.copy()
        with open_dict(task):
            del task["hydra"]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                validate(task)
        except ConfigError as err:
            _fail(prog, f"{where}{set_in_file(err, job)}")
        except PacectlError as err:
            _fail(prog, f"{where}{err}")
        except OmegaConfBaseException as err:
            _fail(prog, f"{where}{config_error(err)}")
    if multirun and jobs:
        base_error = multirun_base_error(config_dir, config_name, overrides)
        if base_error:
            _fail(prog, base_error)
    return None if inspect_only else first


def search_path_error(overrides: Sequence[str]) -> str | None:
    """The line for a ``hydra.searchpath`` folder that does not exist, or None.

    Hydra only warns about it (``UserWarning: provider=hydra.searchpath ... is not available``) and
    goes on without the folder, so its presets then look missing. ``file://`` entries are checked
    (relative ones against the working directory, as Hydra reads them); ``pkg://`` ones are Hydra's.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    for o in overrides:
        if o.lstrip("+").partition("=")[0] != "hydra.searchpath":
            continue
        try:
            value = OverridesParser.create().parse_overrides([o])[0].value()
        except HydraException:
            return None  # a syntax error: the composition reports it
        for entry in value if isinstance(value, list) else [value]:
            if isinstance(entry, str) and entry.startswith("file://") and not Path(entry[7:]).is_dir():
                return (
                    f"hydra.searchpath: {entry} is not a folder (no such directory: {Path(entry[7:]).absolute()}); "
                    f"give config folders that exist, e.g. hydra.searchpath=[file://$PWD/myconf]"
                )
    return None


def multirun_base_error(config_dir: Path, config_name: str, overrides: Sequence[str]) -> str | None:
    """Why Hydra's first composition of a ``-m`` sweep fails although each job composes, or None.

    Hydra composes a sweep's config once *without* the swept values before it runs any job (a swept
    group at its default: ``controller=threshold,pid`` leaves ``controller=all``). A plain override of
    a key only the swept options have (``controller.gain=0.25``) fails there. Hydra's ``++key=value``
    sets the key where it exists and adds it where it does not, so it passes.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return None  # reported per job
    swept = [o.get_key_element() for o in parsed if o.is_sweep_override()]
    base = [text for text, o in zip(overrides, parsed, strict=True) if not o.is_sweep_override()]
    if not swept:
        return None
    try:
        _compose(config_dir, config_name, base)
    except HydraException as err:
        bad = missing_key(err, base)
        override = next((o for o in base if bad and o.partition("=")[0] == bad), None)
        fix = (
            f"write ++{override} (Hydra's set-or-add) instead of {override}"
            if override
            else composition_error(config_dir, config_name, base, err)
        )
        return (
            f"-m sweep: Hydra first composes the config without the swept values ({', '.join(swept)} at "
            f"{'its default' if len(swept) == 1 else 'their defaults'}), and there "
            f"{bad or 'an override'} does not exist: {fix}"
        )
    return None
