"""Fuzz campaign: seeded mutations of the shipped real traces, and random override strings.

Every case is derandomised by its number: case ``i`` of target ``t`` uses ``default_rng([seed, t, i])``,
so a crash is reproduced by ``--only TARGET --from I --cases 1``. Each case is one mutated input:

- bytes: flip bits, overwrite a run with random bytes, cut the file short, delete or duplicate a
  chunk, insert random bytes, swap a number for ``nan``/``-1``/``1e308``/``""``, splice lines;
- gzip files (Kineto): the mutation is applied to the compressed bytes or, half the time, to the
  decompressed text (recompressed), so that the parser, not only gzip, sees the damage;
- overrides: 1-4 ``key=value`` strings built from the shipped config's keys with random values
  (numbers, junk, empty, lists, unicode), checked as ``python -m pacectl.run`` checks its command
  line before Hydra starts (in process).

An outcome is ``ok`` (imported), ``clean`` (a :class:`~pacectl.errors.PacectlError`, or for overrides
exit status 2 with one error line), or a ``crash`` (any other exception, a traceback, or a message
longer than :data:`MAX_MESSAGE` characters). No crash is allowed; the record lists each with its
case number. Peak memory is this process's ``ru_maxrss`` (every case runs in it).

Usage::

    python experiments/fuzz/fuzz_importers.py                      # 10,000+ cases, writes results/campaign.json
    python experiments/fuzz/fuzz_importers.py --cases 20 --out /tmp/fuzz.json
    # in chunks (each its own process, e.g. under `timeout`), then one record of them all:
    python experiments/fuzz/fuzz_importers.py --from 0 --cases 278 --out /tmp/chunk0.json
    python experiments/fuzz/fuzz_importers.py --merge /tmp/chunk*.json

``tests/test_fuzz.py`` runs a small derandomised slice of the same cases in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import platform
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pacectl.data import DATA_DIR
from pacectl.errors import PacectlError

#: A clean error longer than this is counted as a crash (the user was shown a wall of text).
MAX_MESSAGE = 2000
#: Seconds one case may take before it counts as a hang.
CASE_TIMEOUT_S = 60


@dataclass(frozen=True)
class Target:
    """One input to mutate: ``files`` copied to a scratch folder, ``victim`` the one mutated."""

    name: str
    files: tuple[Path, ...]
    victim: int
    load: Callable[[list[Path]], Any]


def _targets() -> list[Target]:
    from pacectl.traces.bytedance import load_bytedance
    from pacectl.traces.canonical import load_canonical
    from pacectl.traces.flight_recorder import load_flight_recorder
    from pacectl.traces.kineto import load_kineto
    from pacectl.traces.nccl_inspector import load_nccl_inspector
    from pacectl.traces.steplevel import load_steplevel

    bd = DATA_DIR / "bytedance"
    fr_pickles = tuple(sorted((DATA_DIR / "flight-recorder" / "ddp2").glob("fr_trace_rank_*")))
    fr_json = tuple(sorted((DATA_DIR / "flight-recorder" / "ddp4_json").glob("*.json")))
    nccl = tuple(sorted((DATA_DIR / "nccl-inspector" / "plain").glob("*.log")))
    kineto = tuple(sorted((DATA_DIR / "hta" / "trace_filter").glob("*.json.gz")))
    targets = [
        Target("steplevel_csv", (DATA_DIR / "alibaba-pai" / "job_1_norm.csv",), 0, lambda f: load_steplevel(f[0])),
        Target("bytedance_parquet", (bd / "trace-ST.parquet", bd / "meta-ST.yaml"), 0, lambda f: load_bytedance(f[0], f[1])),
        Target("bytedance_meta_yaml", (bd / "trace-ST.parquet", bd / "meta-ST.yaml"), 1, lambda f: load_bytedance(f[0], f[1])),
        Target("kineto_json_gz", kineto, 0, lambda f: load_kineto([str(p) for p in f])),
        Target("nccl_inspector_log", nccl, 0, lambda f: load_nccl_inspector([str(p) for p in f])),
    ]  # fmt: skip
    for name, files in (("flight_recorder_pickle", fr_pickles), ("flight_recorder_json", fr_json)):
        if files:
            targets.append(Target(name, files, 0, lambda f: load_flight_recorder([str(p) for p in f])))
    canonical = _canonical_seed()
    if canonical is not None:
        targets.append(Target("canonical_parquet", (canonical,), 0, lambda f: load_canonical(f[0])))
    return targets


_SEED_DIR = Path(tempfile.mkdtemp(prefix="pacectl-fuzz-seed-"))


def _canonical_seed() -> Path | None:
    """A canonical Parquet made from the shipped Alibaba job (pacectl's own record format)."""
    from pacectl.traces.canonical import write_canonical
    from pacectl.traces.steplevel import load_steplevel

    path = _SEED_DIR / "job1.parquet"
    if not path.exists():
        write_canonical(load_steplevel(DATA_DIR / "alibaba-pai" / "job_1_norm.csv"), path)
    return path


_NUMBERS = [b"nan", b"-1", b"1e308", b"", b"0", b"-0", b"inf", b"99999999999999999999", b"\xff"]


def mutate(data: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    """One random mutation of ``data`` and its name."""
    n = len(data)
    kind = str(
        rng.choice(["flip", "overwrite", "truncate", "delete", "duplicate", "insert", "number", "lines"])
    )
    b = bytearray(data)
    if n == 0:
        return bytes(rng.integers(0, 256, 16, dtype=np.uint8)), "insert"
    if kind == "flip":
        for i in rng.integers(0, n, int(rng.integers(1, 9))):
            b[int(i)] ^= 1 << int(rng.integers(0, 8))
    elif kind == "overwrite":
        i = int(rng.integers(0, n))
        k = int(rng.integers(1, 64))
        b[i : i + k] = bytes(rng.integers(0, 256, k, dtype=np.uint8))
    elif kind == "truncate":
        b = b[: int(rng.integers(0, n))]
    elif kind == "delete":
        i = int(rng.integers(0, n))
        del b[i : i + int(rng.integers(1, max(2, n // 10)))]
    elif kind == "duplicate":
        i = int(rng.integers(0, n))
        b[i:i] = b[i : i + int(rng.integers(1, max(2, n // 10)))]
    elif kind == "insert":
        i = int(rng.integers(0, n))
        b[i:i] = bytes(rng.integers(0, 256, int(rng.integers(1, 32)), dtype=np.uint8))
    elif kind == "number":
        digits = [i for i in range(n) if 48 <= b[i] <= 57]
        if digits:
            i = int(rng.choice(digits))
            j = i
            while j < n and (48 <= b[j] <= 57 or b[j] == 46):
                j += 1
            b[i:j] = _NUMBERS[int(rng.integers(0, len(_NUMBERS)))]
    else:  # lines: drop, repeat or swap whole lines (text formats)
        lines = bytes(b).split(b"\n")
        if len(lines) > 2:
            i, j = (int(x) for x in rng.integers(0, len(lines), 2))
            op = int(rng.integers(0, 3))
            if op == 0:
                del lines[i]
            elif op == 1:
                lines.insert(i, lines[j])
            else:
                lines[i], lines[j] = lines[j], lines[i]
        b = bytearray(b"\n".join(lines))
    return bytes(b), kind


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def run_import_case(target: Target, index: int, seed: int, scratch: Path) -> dict[str, Any]:
    """Mutate ``target`` (case ``index``), import it, classify the outcome."""
    rng = np.random.default_rng([seed, zlib_crc(target.name), index])
    folder = scratch / f"{target.name}-{index}"
    folder.mkdir(parents=True)
    files = []
    for k, src in enumerate(target.files):
        dst = folder / src.name
        raw = src.read_bytes()
        kind = "copy"
        if k == target.victim:
            if raw[:2] == b"\x1f\x8b" and rng.random() < 0.5:  # damage the text inside the gzip
                text, kind = mutate(gzip.decompress(raw), rng)
                raw, kind = gzip.compress(text), f"gz-inner-{kind}"
            else:
                raw, kind = mutate(raw, rng)
            mutation = kind
        dst.write_bytes(raw)
        files.append(dst)
    out: dict[str, Any] = {"target": target.name, "case": index, "mutation": mutation}
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            target.load(files)
        out["outcome"] = "ok"
    except PacectlError as err:
        text = str(err)
        out["outcome"] = "clean" if len(text) <= MAX_MESSAGE else "crash"
        out["message_chars"] = len(text)
        if out["outcome"] == "crash":
            out["error"] = f"message of {len(text)} characters: {text[:200]}"
    except _Timeout:
        out["outcome"] = "crash"
        out["error"] = f"hang: more than {CASE_TIMEOUT_S} s"
    except Exception as err:  # noqa: BLE001 (a crash is what the campaign counts)
        out["outcome"] = "crash"
        out["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        out["where"] = traceback.format_exc().strip().splitlines()[-3][:300]
    finally:
        signal.alarm(0)
        shutil.rmtree(folder, ignore_errors=True)
    return out


def zlib_crc(name: str) -> int:
    import zlib

    return zlib.crc32(name.encode())


_VALUES = [
    "1", "0", "-1", "1e308", "nan", "inf", "-inf", "''", "null", "true", "[]", "[1,2]", "{a: 1}", "abc",
    "0.5", "2**64", "99999999999", "é", "${oc.env:NOPE}", "${now:%Y}", "'a b'", "??", "1,2,3", "\\x00",
]  # fmt: skip


def _override_keys() -> list[str]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from pacectl.config import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["backend=sim"])
    flat: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            flat.append(prefix[:-1])

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    groups = ["backend", "trace", "controller", "cluster", "analysis", "comm"]
    return sorted(set(flat)) + groups


def run_override_case(keys: list[str], index: int, seed: int) -> dict[str, Any]:
    """1-4 random overrides, checked as ``python -m pacectl.run`` checks its command line."""
    from pacectl.cli import check_command_line
    from pacectl.config import CONF_DIR
    from pacectl.run import _check_config

    rng = np.random.default_rng([seed, zlib_crc("overrides"), index])
    argv = []
    for _ in range(int(rng.integers(1, 5))):
        key = str(rng.choice(keys))
        value = str(rng.choice(_VALUES))
        form = int(rng.integers(0, 4))
        argv.append({0: f"{key}={value}", 1: f"+{key}={value}", 2: f"{key}", 3: f"{key}=={value}"}[form])
    out: dict[str, Any] = {"target": "overrides", "case": index, "argv": argv}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_command_line("pacectl.run", CONF_DIR, "config", validate=_check_config, argv=argv)
        out["outcome"] = "ok"
    except SystemExit as exit_:
        text = err.getvalue()
        lines = [line for line in text.splitlines() if line.strip()]
        bad = "Traceback" in text or exit_.code != 2 or len(text) > MAX_MESSAGE
        out["outcome"] = "crash" if bad else "clean"
        out["message_chars"] = len(text)
        if bad:
            out["error"] = f"exit {exit_.code}: {text[-300:]}"
        out["lines"] = len(lines)
    except Exception as e:  # noqa: BLE001
        out["outcome"] = "crash"
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return out


def _write(
    args: argparse.Namespace, rows: list[dict[str, Any]], t0: float, *, partial: bool
) -> dict[str, Any]:
    """Write the campaign's record (also after each target, marked ``partial``)."""
    from pacectl.files import atomic_write_text

    by_target: dict[str, dict[str, int]] = {}
    for r in rows:
        counts = by_target.setdefault(r["target"], {"cases": 0, "ok": 0, "clean": 0, "crash": 0})
        counts["cases"] += 1
        counts[r["outcome"]] += 1
    record = {
        "machine": platform.platform(),
        "python": platform.python_version(),
        "command": "python experiments/fuzz/fuzz_importers.py " + " ".join(sys.argv[1:]),
        "partial": partial,
        "seed": args.seed,
        "cases": len(rows),
        "by_target": by_target,
        "crashes": [r for r in rows if r["outcome"] == "crash"],
        "longest_clean_message_chars": max(
            (r.get("message_chars", 0) for r in rows if r["outcome"] == "clean"), default=0
        ),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "loadavg_end": list(os.getloadavg()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(record, indent=2) + "\n")
    return record


def merge(paths: list[Path], out: Path) -> dict[str, Any]:
    """One record of several chunk records: counts summed, crashes joined, peak memory the largest
    chunk's (each chunk is its own process), wall time the sum; partial if any chunk was."""
    from pacectl.files import atomic_write_text

    chunks = [json.loads(p.read_text()) for p in paths]
    by_target: dict[str, dict[str, int]] = {}
    for c in chunks:
        for target, counts in c["by_target"].items():
            total = by_target.setdefault(target, dict.fromkeys(counts, 0))
            for k, v in counts.items():
                total[k] += v
    record = {
        "machine": chunks[0]["machine"],
        "python": chunks[0]["python"],
        "command": [c["command"] for c in chunks],
        "partial": any(c["partial"] for c in chunks),  # a chunk cut short (its counts are what it did)
        "seed": sorted({c["seed"] for c in chunks}),
        "cases": sum(c["cases"] for c in chunks),
        "by_target": by_target,
        "crashes": [x for c in chunks for x in c["crashes"]],
        "longest_clean_message_chars": max(c["longest_clean_message_chars"] for c in chunks),
        "peak_rss_mb": max(c["peak_rss_mb"] for c in chunks),
        "wall_s": round(sum(c["wall_s"] for c in chunks), 1),
        "loadavg_end": [c["loadavg_end"] for c in chunks],
    }
    atomic_write_text(out, json.dumps(record, indent=2) + "\n")
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=1200, help="cases per target (8 inputs + overrides)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--from", dest="start", type=int, default=0, help="first case number")
    ap.add_argument("--only", default=None, help="one target name")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "campaign.json")
    ap.add_argument("--merge", nargs="+", type=Path, default=None, help="chunk records to merge into --out")
    args = ap.parse_args()
    if args.merge:
        record = merge(args.merge, args.out)
        print(json.dumps({k: v for k, v in record.items() if k != "crashes"}, indent=1))
        print(f"crashes: {len(record['crashes'])}; written: {args.out}")
        return
    targets = [t for t in _targets() if args.only in (None, t.name)]
    keys = _override_keys() if args.only in (None, "overrides") else []
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pacectl-fuzz-") as tmp:
        for target in targets:
            t1 = time.perf_counter()
            for i in range(args.start, args.start + args.cases):
                rows.append(run_import_case(target, i, args.seed, Path(tmp)))
            print(f"{target.name}: {args.cases} cases in {time.perf_counter() - t1:.0f} s", flush=True)
            _write(args, rows, t0, partial=True)  # a campaign cut short keeps what it did
        if keys:
            t1 = time.perf_counter()
            for i in range(args.start, args.start + args.cases):
                rows.append(run_override_case(keys, i, args.seed))
            print(f"overrides: {args.cases} cases in {time.perf_counter() - t1:.0f} s", flush=True)
    record = _write(args, rows, t0, partial=False)
    print(json.dumps({k: v for k, v in record.items() if k != "crashes"}, indent=1))
    print(f"crashes: {len(record['crashes'])}; written: {args.out}")
    shutil.rmtree(_SEED_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
