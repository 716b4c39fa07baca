"""``python -m pacectl.traces``: inspect, validate and convert trace files.

Subcommands (``python -m pacectl.traces <cmd> --help`` for options):

- ``info PATH...``: ranks, steps, collectives per step, arrival-spread summary, clock-alignment
  residual, step times;
- ``validate PATH...``: every problem found, one per line as ``file:event #i: field: message``
  (:data:`VALIDATE_RULE`);
- ``convert PATH... -o OUT.parquet``: write pacectl's canonical Parquet (atomically);
- ``fit PATH...``: fit the communication-timing model and print its slopes, checks and verdict
  (:mod:`pacectl.fabric.fitted` says what each means).

Formats (``--format``, default by file name and first bytes, :mod:`pacectl.traces.detect`): those
of :mod:`pacectl.traces`; ``bytedance`` needs ``--meta``, found beside a ``trace-X.parquet`` as
``meta-X.yaml`` when not given; ``info`` on a Flight Recorder hang snapshot prints which ranks each
process group waits for and exits 0. Exit codes (as ``pacectl.run``'s, :mod:`pacectl.errors`): 0
usable, 2 unusable trace (message on stderr, no traceback) or bad command line (also an ``-o`` that
cannot be written).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from pacectl.errors import EXIT_USER_ERROR, ConfigError, PacectlError, TraceError, plural
from pacectl.files import folder_problem, jsonable
from pacectl.traces.detect import detect_format, meta_beside, other_traces_in
from pacectl.traces.model import OpTrace, TraceWarning, quantile_stats

FORMATS = ("auto", "flight_recorder", "nccl_inspector", "kineto", "steplevel", "canonical", "bytedance")
#: formats that take a set of files (a folder, glob or several paths)
_MULTI_FILE = ("kineto", "flight_recorder", "nccl_inspector")


def _detect(paths: list[str], fmt: str, meta: str | None) -> str:
    if fmt != "auto":
        return fmt
    found, _ = detect_format(paths[0])
    if found == "canonical" and meta:
        return "bytedance"
    return found or "kineto"  # anything else is tried as Kineto JSON, whose errors say what it is not


class OutputError(PacectlError):
    """The ``-o`` path cannot be written (exit 2: fix the command line)."""


class CommandLineError(PacectlError):
    """The command line lacks what the trace needs (exit 2: fix the command line)."""


def _load(args: argparse.Namespace) -> tuple[OpTrace, dict[str, Any] | None, list[str]]:
    """Load the trace named on the command line.

    Returns:
        The trace, the Kineto report summary (None for other formats) and the importer's warnings
        (what was repaired or dropped), in order. A Flight Recorder or NCCL Inspector import leaves
        its report in ``args.collective_report``.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceWarning)
        trace, rep = _load_quiet(args)
    notes = list(rep["warnings"]) if rep is not None else []
    notes += [str(w.message) for w in caught if issubclass(w.category, TraceWarning) and rep is None]
    return trace, rep, notes


def _load_collective_log(args: argparse.Namespace, fmt: str) -> OpTrace:
    """Flight Recorder or NCCL Inspector: the trace; the report goes to ``args.collective_report``."""
    from pacectl.traces.collectives import LayoutOverrides

    layout = LayoutOverrides.of(args)
    report: Any
    if fmt == "flight_recorder":
        from pacectl.traces.flight_recorder import import_flight_recorder

        trace, report = import_flight_recorder(
            args.paths,
            ranks=args.rank,
            max_bytes=int(args.max_mb * 2**20),
            max_ops=args.max_ops,
            layout=layout,
            timing=args.timing,
            collective_s=args.collective_s,
            all_gathers=args.all_gathers,
        )
    else:
        from pacectl.traces.nccl_inspector import import_nccl_inspector

        trace, report = import_nccl_inspector(
            args.paths, max_bytes=int(args.max_mb * 2**20), max_ops=args.max_ops, layout=layout
        )
    args.collective_report = report
    return trace


def _load_quiet(args: argparse.Namespace) -> tuple[OpTrace, dict[str, Any] | None]:
    if args.format in ("auto", "bytedance") and not args.meta and len(args.paths) == 1:
        beside = meta_beside(args.paths[0])
        if beside is not None:  # the shipped layout: trace-AR.parquet next to meta-AR.yaml
            print(f"reading {args.paths[0]} as a ByteDance trace with {beside} (--meta)", file=sys.stderr)
            args.meta = str(beside)
    fmt = _detect(args.paths, args.format, args.meta)
    if fmt not in _MULTI_FILE and len(args.paths) != 1:
        raise CommandLineError(f"a {fmt} trace must be one file, got {len(args.paths)} paths; name one")
    if fmt in ("flight_recorder", "nccl_inspector"):
        return _load_collective_log(args, fmt), None
    if fmt == "kineto":
        from pacectl.traces.kineto import import_kineto

        try:
            trace, report = import_kineto(
                args.paths,
                ranks=args.rank,
                world_size=args.world_size,
                strict=args.strict,
                align=args.align,
                drop_unmatched=args.drop_unmatched,
                max_bytes=int(args.max_mb * 2**20),
            )
        except TraceError as err:
            others = other_traces_in(args.paths[0]) if len(args.paths) == 1 else []
            if others:  # a folder of ByteDance / step-level files read as Kineto: name them instead
                raise CommandLineError(
                    f"{args.paths[0]} is read as a folder of Kineto JSON files, and failed ({err}); it "
                    f"also holds {', '.join(others[:4])}: to read one of those, name the file"
                ) from err
            raise
        return trace, report.summary()
    if fmt == "steplevel":
        from pacectl.traces.steplevel import load_steplevel

        return load_steplevel(args.paths[0], collective_s=args.collective_s), None
    if fmt == "canonical":
        from pacectl.traces.canonical import load_canonical

        return load_canonical(args.paths[0]), None
    from pacectl.traces.bytedance import load_bytedance

    if not args.meta:
        raise CommandLineError(
            "a bytedance trace needs its job meta YAML, got no --meta; add --meta <meta.yaml> (the "
            "shipped traces have it beside them: pacectl/data/bytedance/meta-AR.yaml)"
        )
    return load_bytedance(args.paths[0], args.meta), None


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f} ms"


def _time_formatter(trace: OpTrace) -> Any:
    """Seconds as ms, or, for a normalised trace, as the file's normalised units."""
    if trace.time_normalized:
        return lambda x: f"{x / trace.norm_unit_s:.3f} units"
    return _ms


def _spread_stats(trace: OpTrace) -> tuple[np.ndarray, np.ndarray]:
    """Arrival spread per (step, stage) group at the first grads-reduce-scatter, and step times (s)."""
    ops = trace.ops
    rs = ops[(ops["optype"] == "grads-reduce-scatter") & (ops["seq_id"] == 0)]
    spread = rs.groupby(["step", "stage"])["start_ts"].agg(lambda s: s.max() - s.min()).to_numpy()
    return spread, trace.recorded_step_time_s().to_numpy()


def _say(args: argparse.Namespace) -> Callable[..., None]:
    # with --json, stdout holds the JSON alone (pipe it to a parser); the text goes to stderr
    return functools.partial(print, file=sys.stderr if args.json else sys.stdout)


def _print_groups(say: Callable[..., None], report: Any) -> None:
    """The process groups (Flight Recorder) or communicators (NCCL Inspector) of a report."""
    say(f"process groups ({len(report.groups)}):")
    for g in report.groups:
        shown = list(g.ranks)[:16]
        say(
            f"  {g.label}: role {g.role}, ranks {shown}{' ...' if len(g.ranks) > 16 else ''} "
            f"(members from {g.ranks_from})"
        )


def _print_p2p(say: Callable[..., None], report: Any) -> None:
    """The Flight Recorder point-to-point matching, per process group and ordered pair."""
    p2p = report.p2p
    if p2p is None or (not p2p.pairs and not p2p.other):
        gloo = " (gloo records no send/recv in torch 2.13)" if "gloo" in report.backends else ""
        say(f"p2p       no send/recv recorded{gloo}")
        return
    say(
        f"p2p       {p2p.matched} send/recv pairs matched, {p2p.unmatched} ops unmatched, by (process group, "
        "ordered pair, p2p_seq_id); reported only: the replay folds p2p ops into compute (no stage-to-stage "
        "dependencies from them)"
    )
    for line in p2p.lines():
        say(f"  {line}")


def _info_hang(args: argparse.Namespace) -> int | None:
    """``info`` on a Flight Recorder hang snapshot: groups and who is behind; exit 0. None: not one."""
    from pacectl.traces.flight_recorder import describe_status, inspect_flight_recorder

    _, report = inspect_flight_recorder(
        args.paths, ranks=args.rank, max_bytes=int(args.max_mb * 2**20), max_ops=args.max_ops
    )
    if report.hang is None:
        return None
    say = _say(args)
    say(f"trace     {'; '.join(report.files[:4])}{' ...' if len(report.files) > 4 else ''}")
    say(f"format    flight_recorder (versions {', '.join(report.versions)}; {', '.join(report.formats)})")
    say(
        f"ranks     {len(report.ranks)} dumps, world size {max(report.ranks) + 1}; backends {report.backends}"
    )
    _print_groups(say, report)
    say(f"HANG SNAPSHOT (not replayable): {report.hang}")
    say(
        "behind report, per process group (collective_seq_id of the last collective enqueued/started/completed):"
    )
    for line in describe_status(report.status):
        say(f"  {line}")
    _print_p2p(say, report)
    if args.json:
        print(
            json.dumps(jsonable({"format": "flight_recorder", **report.summary()}), indent=1, allow_nan=False)
        )
    return 0


def _print_collective_report(say: Callable[..., None], report: Any) -> None:
    """What a Flight Recorder / NCCL Inspector import found: groups, layout, timing, steps."""
    from pacectl.traces.flight_recorder import FlightRecorderReport, describe_status

    a = report.assembly
    lay = a.layout
    _print_groups(say, report)
    say(
        f"layout    dp {lay.dp_size} x pp {lay.pp_size} x tp {lay.tp_size} (world size {lay.world_size}): {lay.how}"
    )
    say(f"timing    {a.timing}: {a.timing_note}")
    say(f"transfer  {a.transfer_note}")
    say(
        f"steps     {a.steps} replayed, inferred from the DP gradient collectives' pattern "
        f"({a.collectives_per_step} per step per stage); compute = the gaps between a rank's collectives"
    )
    if a.folded_per_step:
        say(f"folded into compute, per rank per step: {a.folded_per_step}")
    if isinstance(report, FlightRecorderReport):
        say(
            f"dumps     versions {', '.join(report.versions)} ({', '.join(report.formats)}); backends {report.backends}"
        )
        say("status per process group (last collective enqueued/started/completed):")
        for line in describe_status(report.status):
            say(f"  {line}")
        _print_p2p(say, report)
    else:
        say(
            f"logs      Inspector format {', '.join(report.versions) or 'unknown'}; verbose {report.verbose}; "
            f"timing sources {report.timing_sources}; ranks from {report.rank_from}; "
            f"{report.p2p_records} p2p records folded"
        )


def cmd_info(args: argparse.Namespace) -> int:
    if _detect(args.paths, args.format, args.meta) == "flight_recorder":
        code = _info_hang(args)
        if code is not None:
            return code
    trace, rep, notes = _load(args)
    say = _say(args)
    m = trace.meta
    fmt_t = _time_formatter(trace)
    say(f"trace     {trace.source}")
    say(f"format    {trace.fmt}   job {m.name!r}")
    if trace.time_normalized:
        say(
            f"times     NORMALISED units, not real time (the file records no absolute times); replayed "
            f"as 1 unit = {trace.norm_unit_s:g} s, so seconds and it/s derived from this trace are "
            "arbitrary: compare only ratios (CV, relative throughput)"
        )
    if trace.sample_every_iters > 1:
        say(
            f"sampling  every {trace.sample_every_iters} iterations: consecutive steps are "
            f"{trace.sample_every_iters} real iterations apart (a lag of 1 step is {trace.sample_every_iters} iterations)"
        )
    ranks = sorted(trace.ops["rank"].unique().tolist())
    per_cell = (  # a count: validate_ops has checked that each (dp_rank, stage) cell maps to one rank
        " = one per (dp, pp) cell, its tp x dsp ranks not recorded"
        if len(ranks) == m.dp_size * m.pp_size and m.tp_size * m.dsp_size > 1
        else ""
    )
    say(
        f"ranks     {len(ranks)} of world_size {m.world_size} recorded{per_cell} "
        f"{ranks[:16]}{' ...' if len(ranks) > 16 else ''}  "
        f"(dp {m.dp_size} x pp {m.pp_size} x tp {m.tp_size} x dsp {m.dsp_size})"
    )
    steps = trace.steps
    say(f"steps     {len(steps)}: {steps[:12].tolist()}{' ...' if len(steps) > 12 else ''}")
    per_step = (
        trace.ops[trace.ops["optype"] == "grads-reduce-scatter"].groupby(["step", "dp_rank", "stage"]).size()
    )
    collectives = int(per_step.median()) if len(per_step) else 0
    say(f"collectives per step per rank ({trace.collective or 'grads-reduce-scatter'}): {collectives}")
    spread, step_t = _spread_stats(trace)
    cv = float(step_t.std() / step_t.mean()) if len(step_t) and step_t.mean() > 0 else float("nan")
    if len(step_t):
        say(
            f"step time mean {fmt_t(float(step_t.mean()))}, median {fmt_t(float(np.median(step_t)))}, CV {cv:.3f}"
        )
    if len(spread):
        say(
            f"arrival spread (first bucket, max-min start over DP ranks): median {fmt_t(float(np.median(spread)))}, "
            f"p99 {fmt_t(float(np.quantile(spread, 0.99)))}, max {fmt_t(float(spread.max()))}"
        )
    if rep is not None:
        ca = rep["clock_alignment"]
        say(f"collectives from {rep['collective_source']}; arrival = {rep['arrival_source']}")
        say(
            f"kinds per step per rank: {rep['collective_kinds']}; folded into compute: {rep['folded_collectives_per_step']}"
        )
        say(f"matching  {rep['matching']}")
        offs = {k: round(v * 1e3, 3) for k, v in ca["offsets_s"].items()}
        say(
            f"clock alignment ({ca['mode']}, {'applied' if ca['applied'] else 'not applied'}): offsets ms {offs}; "
            f"residual (max-min collective end over ranks) median {_ms(ca['residual_median_s'])}, "
            f"max {_ms(ca['residual_max_s'])}"
        )
        allb = rep["arrival_spread_all_buckets_s"]
        if allb:
            say(
                f"arrival spread (all buckets, true arrivals): median {_ms(allb['median'])}, p99 {_ms(allb['p99'])}, max {_ms(allb['max'])}"
            )
    elif getattr(args, "collective_report", None) is not None:
        _print_collective_report(say, args.collective_report)
    else:
        say("clock alignment: not needed (timestamps already aligned or step-level)")
    for w in notes:
        say(f"warning: {w}")
    if args.json:

        def stats(x: np.ndarray) -> dict[str, float] | None:
            """Seconds (or normalised units scaled to seconds, see ``norm_unit_s``)."""
            return {"mean": float(x.mean()), **(quantile_stats(x) or {})} if len(x) else None

        out = {
            "source": trace.source,
            "format": trace.fmt,
            "job": m.name,
            "world_size": m.world_size,
            "dp_size": m.dp_size,
            "pp_size": m.pp_size,
            "tp_size": m.tp_size,
            "dsp_size": m.dsp_size,
            "time_unit": trace.time_unit,
            "norm_unit_s": trace.norm_unit_s,
            "sample_every_iters": trace.sample_every_iters,
            "ranks": ranks,
            "steps": steps.tolist(),
            "collective": trace.collective or "grads-reduce-scatter",
            "collectives_per_step_per_rank": collectives,
            "step_time_s": stats(step_t),
            "step_time_cv": cv,  # NaN: null
            "arrival_spread_first_bucket_s": stats(spread),
            "warnings": notes,
            "kineto": rep,
        }
        extra = getattr(args, "collective_report", None)
        if extra is not None:
            out[trace.fmt] = extra.summary()
        print(json.dumps(jsonable(out), indent=1, allow_nan=False))  # non-finite -> null: strict JSON
    return 0


#: what validate's exit status says: the trace is usable as pacectl.run reads it (README)
VALIDATE_RULE = (
    "List every problem (file, event, field), one per line; exit 2 if any. Exit 0 means the trace is "
    "usable as pacectl.run reads it: a truncated Kineto file (read up to its last whole event) and "
    "missing rank files are warnings, not problems, unless --strict (as trace.strict=true)."
)


def cmd_validate(args: argparse.Namespace) -> int:
    from pacectl.traces.kineto import TraceProblems

    try:
        trace, _, notes = _load(args)
    except TraceError as err:  # a Kineto import's TraceProblems lists every problem it found
        problems = err.problems if isinstance(err, TraceProblems) else [in_this_commands_words(str(err))]
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        print(f"invalid: {plural(len(problems), 'problem')}", file=sys.stderr)
        return EXIT_USER_ERROR
    for w in notes:
        print(f"warning: {w}")
    unit = ", times in normalised units" if trace.time_normalized else ""
    unit += f", arrival timing {trace.timing.partition(':')[0]}" if trace.timing else ""
    caveat = f"; usable with {plural(len(notes), 'warning')} above" if notes else ""
    if notes and trace.fmt == "kineto" and not args.strict:
        caveat += " (--strict makes truncation and missing ranks problems)"
    sizes = f"{plural(trace.num_ranks, 'rank')}, {plural(len(trace.steps), 'step')}, {plural(len(trace.ops), 'op')}"
    print(f"ok: {trace.source} ({trace.fmt}, {sizes}{unit}){caveat}")
    return 0


def _check_output(out: Path) -> None:
    """Fail before the (possibly long) import when ``-o`` obviously cannot be written."""
    if out.is_dir():
        raise OutputError(
            f"could not write {out}: it is a directory; -o must name the output file, e.g. {out / 'trace.parquet'}"
        )
    if out.suffix.lower() != ".parquet":
        raise OutputError(
            f"-o {out}: the canonical trace is a Parquet file, so its name must end in .parquet "
            f"(e.g. {out.with_suffix('.parquet')}); nothing was written"
        )
    problem = folder_problem(out.parent)
    if problem:
        raise OutputError(f"could not write {out}: {problem}. Pick another -o path.")


def cmd_fit(args: argparse.Namespace) -> int:
    from pacectl.backends.replay import ReplayBackend
    from pacectl.fabric.fitted import fit_backend, fit_options

    flags = {
        "ranks_per_node": "--ranks-per-node",
        "rank_order": "--rank-order",
        "block_steps": "--block-steps",
    }
    flags |= {"tolerance_frac": "--tolerance", "seed": "--seed"}
    try:
        options = fit_options(
            {
                "ranks_per_node": args.ranks_per_node,
                "rank_order": args.rank_order,
                "block_steps": args.block_steps,
                "tolerance_frac": args.tolerance,
                "seed": args.seed,
            }
        )
    except ConfigError as err:  # named by its flag here, not by pacectl.run's override
        flag = flags.get((err.key or "").rpartition(".")[2])
        if flag and err.hint:
            raise ConfigError(str(err).replace(err.hint, f"flag {flag}")) from None
        raise
    trace, _, notes = _load(args)
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    print(f"fitting {trace.source} ({len(trace.ops)} ops, {len(trace.steps)} steps) ...", file=sys.stderr)
    fit = fit_backend(ReplayBackend(trace), **options)
    if args.json:
        print(json.dumps(fit.to_dict(), indent=2))
        return 0
    print(f"trace      {trace.source}")
    print(f"model      log(intrinsic time) = FE[op template, DP rank] + FE[block of {fit.block_steps} steps]")
    print("           + slope per op class x (concurrent transfers, concurrent compute ops on the node)")
    print(f"placement  {fit.placement.describe()} (--ranks-per-node, --rank-order)")
    print(f"covariance {fit.fit.covariance}; {fit.fit.num_obs} op instances")

    def table(title: str, coefs: Any, null: float, unit: str) -> None:
        print(f"{title}")
        print(
            f"  {'op class':<28} {'feature':<8} {'slope':>9} {'95% interval':>22} {'p':>7} {'n':>7}  {unit}"
        )
        for c in coefs:
            if not c.identified:
                print(
                    f"  {c.op_class:<28} {c.feature:<8} {'n/i':>9} {'(too little variation)':>22} {'':>7} {c.num_obs:>7}"
                )
                continue
            ci = f"[{c.ci95_low:+.4f}, {c.ci95_high:+.4f}]"
            print(
                f"  {c.op_class:<28} {c.feature:<8} {c.estimate:+9.4f} {ci:>22} {c.p_value:7.3f} {c.num_obs:>7}"
            )
        print(f"  (max-plus: {null})")

    table("fit (slope of log intrinsic time per concurrent op)", fit.fit.coefficients, 0.0, "")
    print(f"  joint Wald test of every slope = 0: p = {fit.fit.wald_p_value:.3g}")
    table("placebo (features from permuted steps: should find nothing)", fit.placebo.coefficients, 0.0, "")
    print(f"  joint Wald test: p = {fit.placebo.wald_p_value:.3g}")
    print(
        f"held out   fitted on the first half of the steps, the slopes explain {fit.heldout_r2 * 100:+.1f} % of the second half's variation (<= 0: nothing)"
    )
    table("completion on last arrival (s per s)", fit.arrival, 1.0, "")
    for name, r in fit.overlap_residuals.items():
        if r["num_mate_overlap"]:
            without = "none without"
            if r["num_no_overlap"]:
                without = f"{r['median_log_residual_no_overlap']:+.4f} with none ({r['num_no_overlap']})"
            print(
                f"overlap    {name}: median log residual {r['median_log_residual_mate_overlap']:+.4f} when a node-mate's "
                f"transfer overlaps it fully ({r['num_mate_overlap']} instances), {without}"
            )
    print(
        f"probe      random delays before every transfer: fitted minus max-plus mean step time "
        f"{fit.effect_frac * 100:+.3f} % (se {fit.effect_se_frac * 100:.3f} %) of {fit.mean_step_time_s:.4g} s"
    )
    print(f"verdict    {fit.verdict}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from pacectl.traces.canonical import write_canonical

    out: Path = args.output
    _check_output(out)
    trace, _, notes = _load(args)
    for w in notes:
        print(f"warning: {w}")
    try:
        write_canonical(trace, out)
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        raise OutputError(
            f"could not write {out}: {reason}. Pick another -o path (an existing, writable folder); "
            "nothing was written."
        ) from err
    timing = f", arrival timing {trace.timing.partition(':')[0]}" if trace.timing else ""
    print(f"wrote {out} ({len(trace.ops)} ops, {trace.num_ranks} ranks, {len(trace.steps)} steps{timing})")
    return 0


class _OneLineErrors(argparse.ArgumentParser):
    """argparse with a command-line mistake reported in one line (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}. See: {self.prog} --help\n")


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    """An argparse ``type``: a finite number > 0 of ``kind``, else a usage error (exit 2)."""

    def parse(text: str) -> float:
        value = kind(text)  # ValueError: argparse reports "invalid <kind> value"
        if not (math.isfinite(value) and value > 0):
            expected = "an integer >= 1" if kind is int else "a finite number > 0"
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs); sub-commands share its one-line errors."""
    # the console script names itself; python -m shows as __main__.py
    script = Path(sys.argv[0]).name == "pacectl-traces"
    parser = _OneLineErrors(
        prog="pacectl-traces" if script else "python -m pacectl.traces",
        description="Inspect, validate and convert distributed-training traces "
        "(PyTorch Flight Recorder dumps, NCCL Inspector logs, Kineto/PyTorch-profiler JSON, step-level CSV, "
        "ByteDance and pacectl Parquet).",
        epilog="Examples:\n"
        "  python -m pacectl.traces info pacectl/data/h200-capture\n"
        "  python -m pacectl.traces info /tmp/fr_dumps/        # Flight Recorder: groups, layout, who is behind\n"
        "  python -m pacectl.traces validate 'traces/rank*.json.gz'\n"
        "  python -m pacectl.traces convert traces/ -o job.parquet\n"
        "  python -m pacectl.traces fit pacectl/data/bytedance/trace-AR.parquet\n"
        "Exit codes: 0 usable trace, 2 unusable trace (message on stderr) or bad command line.\n"
        "pacectl-traces ... is the same command (pip install puts it on the PATH).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="{info,validate,convert,fit}")
    common = _OneLineErrors(add_help=False)
    common.add_argument(
        "paths", nargs="+", metavar="PATH", help="trace file(s), a directory of rank files, or a glob"
    )
    common.add_argument(
        "--format", choices=FORMATS, default="auto", help="input format (default: by file name)"
    )
    common.add_argument("--meta", help="job meta YAML (ByteDance traces only)")
    common.add_argument(
        "--rank",
        type=int,
        nargs="+",
        help="Kineto: rank of each file, in sorted-path order (put it after the paths: it takes every "
        "number that follows)",
    )
    common.add_argument(
        "--world-size", type=_positive(int), help="Kineto: expected world size (overrides distributedInfo)"
    )
    common.add_argument(
        "--strict", action="store_true", help="Kineto: truncated files and missing ranks are errors"
    )
    common.add_argument(
        "--align",
        choices=("auto", "end", "none"),
        default="auto",
        help="Kineto: clock alignment on collective ends (default auto)",
    )
    common.add_argument(
        "--drop-unmatched",
        action="store_true",
        help="Kineto: drop steps whose collectives do not match across ranks",
    )
    common.add_argument(
        "--max-mb",
        type=_positive(float),
        default=1024.0,
        help="Kineto: cap on each file's size and decompressed text, MiB (default 1024)",
    )
    common.add_argument(
        "--max-ops",
        type=_positive(int),
        default=4_000_000,
        help="Flight Recorder: cap on the entries of the set and on the trace's ops; NCCL Inspector: on the "
        "set's collective records (default 4000000)",
    )
    common.add_argument(
        "--collective-s",
        type=_positive(float),
        help="step-level, Flight Recorder without durations: collective transfer time, s (default 1%% of "
        "the median step)",
    )
    common.add_argument(
        "--timing",
        choices=("auto", "duration", "created"),
        default="auto",
        help="Flight Recorder: earliness from durations (clock-free, TORCH_NCCL_ENABLE_TIMING) or enqueue "
        "times (default auto: durations when every gradient collective has one)",
    )
    common.add_argument(
        "--all-gathers",
        choices=("fold", "sync"),
        default="fold",
        help="Flight Recorder: the DP groups' all-gathers fold into compute (default) or are step "
        "collectives (sync: an FSDP job, whose early ranks wait for a straggler in them)",
    )
    for flag, what in (("--dp-size", "DP"), ("--tp-size", "TP"), ("--pp-size", "PP")):
        common.add_argument(
            flag,
            type=_positive(int),
            help=f"Flight Recorder, NCCL Inspector: the {what} degree, when the groups do not tell the layout "
            "(rank order: TP fastest, then DP, then PP)",
        )
    common.add_argument(
        "--dp-group", help="Flight Recorder, NCCL Inspector: the description (or name) of the DP groups"
    )
    common.add_argument(
        "--collectives-per-step",
        type=_positive(int),
        help="Flight Recorder, NCCL Inspector: gradient collectives per step, when the pattern is ambiguous",
    )
    p_info = sub.add_parser(
        "info", parents=[common], help="summarise a trace: ranks, steps, collectives, spreads, clocks"
    )
    p_info.add_argument(
        "--json", action="store_true", help="print the summary as JSON on stdout (the text goes to stderr)"
    )
    p_info.set_defaults(func=cmd_info)
    p_val = sub.add_parser(
        "validate",
        parents=[common],
        help="list every problem (file, event, field); exit 2 if any (truncation: a warning, see --strict)",
        description=VALIDATE_RULE,
    )
    p_val.set_defaults(func=cmd_validate)
    p_conv = sub.add_parser(
        "convert", parents=[common], help="write the canonical Parquet trace (atomically)"
    )
    p_conv.add_argument("-o", "--output", required=True, type=Path, help="output .parquet path")
    p_conv.set_defaults(func=cmd_convert)
    p_fit = sub.add_parser(
        "fit",
        parents=[common],
        help="fit how transfer times depend on concurrent comm and compute; judge max-plus",
        description="Fit the communication-timing model of pacectl/fabric/fitted.py to a trace: slopes with "
        "95 %% intervals, a placebo on permuted steps, a held-out check, the completion-on-arrival slope, and "
        "the verdict. The node placement is an assumption (the traces do not record it).",
    )
    p_fit.add_argument("--ranks-per-node", type=_positive(int), default=8, help="ranks per node (default 8)")
    p_fit.add_argument(
        "--rank-order",
        choices=("megatron", "trace"),
        default="megatron",
        help="global rank of a (dp_rank, stage): megatron = tp * (dp_rank + dp_size * stage) (default), "
        "trace = the trace's rank column",
    )
    p_fit.add_argument(
        "--block-steps", type=_positive(int), default=8, help="steps per fixed-effect block (default 8)"
    )
    p_fit.add_argument(
        "--tolerance",
        type=_positive(float),
        default=0.01,
        help="verdict tolerance, fraction of step time (default 0.01)",
    )
    p_fit.add_argument("--seed", type=int, default=0, help="placebo permutation and probe delays (default 0)")
    p_fit.add_argument("--json", action="store_true", help="print the fit as JSON on stdout")
    p_fit.set_defaults(func=cmd_fit)
    return parser


#: pacectl.run's words in the importers' messages -> this command's options
_RUN_WORDS = (
    ("Use trace=bytedance trace.path=... trace.meta=...", "Use --format bytedance --meta <meta.yaml>"),
    (
        "For other formats pick their importer: trace=bytedance, trace=kineto, trace=steplevel",
        "For other formats pass --format bytedance, kineto or steplevel",
    ),
    ("trace.path must be", "the trace file must be"),
    ("Point trace.path at", "Point the path at"),
    ("trace.path glob must match", "the glob given as PATH must match"),
    ("trace.path", "PATH"),  # any other mention: this command's argument, not pacectl.run's key
)


def in_this_commands_words(message: str) -> str:
    """An importer's message with ``pacectl.run``'s override names replaced by this command's options.

    Example:
        >>> in_this_commands_words("trace.path must be a Parquet file, could not read x")
        'the trace file must be a Parquet file, could not read x'
    """
    for run_words, ours in _RUN_WORDS:
        message = message.replace(run_words, ours)
    return message


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # as pacectl.run names itself
    prog = "pacectl-traces" if parser.prog == "pacectl-traces" else "pacectl.traces"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # warnings are printed by the commands themselves
            return int(args.func(args))
    except PacectlError as err:  # an importer's message in this command's words (ours are already)
        ours = isinstance(err, (OutputError, CommandLineError))
        print(f"{prog}: error: {err if ours else in_this_commands_words(str(err))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # the reader went away (``| head``): not an error of the trace
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except (OSError, MemoryError) as err:
        print(f"{prog}: error: could not read the trace: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
