"""A small derandomised slice of the fuzz campaign (experiments/fuzz/fuzz_importers.py): no crash."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location(
        "fuzz_importers", ROOT / "experiments" / "fuzz" / "fuzz_importers.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_importers"] = module
    spec.loader.exec_module(module)
    return module


def test_mutated_real_traces_import_or_fail_cleanly(fuzz, tmp_path: Path) -> None:
    outcomes = []
    for target in fuzz._targets():
        for i in range(6):
            out = fuzz.run_import_case(target, i, 0, tmp_path)
            assert out["outcome"] != "crash", out
            outcomes.append(out["outcome"])
    assert "clean" in outcomes  # the mutations do reach the checks


def test_random_overrides_are_refused_in_one_line(fuzz) -> None:
    keys = fuzz._override_keys()
    for i in range(25):
        out = fuzz.run_override_case(keys, i, 0)
        assert out["outcome"] != "crash", out


# The crash classes the campaign found (experiments/fuzz/README.md), each as a user meets it: a command
# line that ends in one line naming the file and field, exit 2, no traceback.


def _one_clean_line(proc, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def _validate(*args: str):
    from pacectl.testing.commands import run_command
    from pacectl.traces.__main__ import main

    return run_command(main, ["validate", *args], cwd=Path.cwd())


@pytest.mark.parametrize(
    ("intact", "damage"),
    [
        (b'{"index_columns"', b"{'index_columns'"),  # not JSON
        (b'{"index_columns"', b'{"ind\xeex_columns"'),  # not UTF-8
        (b'"pandas_type"', b'"pandas_tyqe"'),  # JSON, a field renamed: KeyError
        (b'"numpy_type": "float64"', b'"numpy_type": "float44"'),  # a dtype that is none: TypeError
    ],
)
def test_damaged_pandas_schema_metadata_is_one_line(tmp_path: Path, intact: bytes, damage: bytes) -> None:
    """A byte flipped in the Parquet schema's pandas metadata (JSON, inside the base64 Arrow schema
    that pyarrow reads first) raised JSONDecodeError / UnicodeDecodeError (campaign cases
    bytedance_parquet 88, 234; canonical_parquet 120, 212) or, still JSON, a KeyError or TypeError
    from pyarrow's pandas conversion (bytedance_parquet 799, 1040, 1076; canonical_parquet 335, 498)."""
    import base64

    import pyarrow.parquet as pq

    from pacectl.data import DATA_DIR
    from pacectl.traces.canonical import write_canonical
    from pacectl.traces.steplevel import load_steplevel

    good = tmp_path / "job.parquet"
    write_canonical(load_steplevel(DATA_DIR / "alibaba-pai" / "job_1_norm.csv"), good)
    blob = pq.ParquetFile(good).metadata.metadata[b"ARROW:schema"]
    schema = base64.b64decode(blob)
    assert schema.count(intact) >= 1
    bad_blob = base64.b64encode(schema.replace(intact, damage, 1))
    assert len(bad_blob) == len(blob)  # the footer's lengths stay right: only the JSON is damaged
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(good.read_bytes().replace(blob, bad_blob))
    proc = _validate(str(bad))
    _one_clean_line(proc, "schema metadata 'pandas'", str(bad))


def test_flight_recorder_pickle_with_a_huge_length_field_is_one_line(tmp_path: Path) -> None:
    """A BYTEARRAY8 opcode claiming 2**63 bytes raised the unpickler's OverflowError (campaign case
    flight_recorder_pickle 251)."""
    import struct

    from pacectl.data import DATA_DIR

    src = sorted((DATA_DIR / "flight-recorder" / "ddp2").glob("fr_trace_rank_*"))
    raw = src[0].read_bytes()
    bad = tmp_path / "fr_trace_rank_0"
    bad.write_bytes(raw[:2] + b"\x96" + struct.pack("<Q", 1 << 63) + raw[2:])  # after PROTO
    (tmp_path / "fr_trace_rank_1").write_bytes(src[1].read_bytes())
    proc = _validate("--format", "flight_recorder", str(bad), str(tmp_path / "fr_trace_rank_1"))
    _one_clean_line(proc, "OverflowError", str(bad))


@pytest.mark.parametrize(
    ("fmt", "folder", "intact", "damage", "needle"),
    [  # campaign cases flight_recorder_json 327; nccl_inspector_log 820, 877
        (
            "flight_recorder",
            "flight-recorder/ddp4_json",
            b'"pg_id":0',
            b'"pg_id":1e30',
            "pg_id must fit in a 64-bit integer",
        ),
        (
            "nccl_inspector",
            "nccl-inspector/plain",
            b'"coll_msg_size_bytes": 8192',
            b'"coll_msg_size_bytes": 99999999999999999999',
            "coll_perf.coll_msg_size_bytes must fit in a 64-bit integer",
        ),
        (  # a field read one record at a time: float() of it raised OverflowError
            "nccl_inspector",
            "nccl-inspector/plain",
            b'"coll_exec_time_us": 1000',
            b'"coll_exec_time_us": ' + b"9" * 400,
            "coll_exec_time_us must be a non-negative number below 2**63, got 99999999999999999999... (400 digits)",
        ),
    ],
)
def test_an_integer_past_int64_is_one_line(
    tmp_path: Path, fmt: str, folder: str, intact: bytes, damage: bytes, needle: str
) -> None:
    """A number swapped for a huge one (1e30 read as an integer id; 99999999999999999999) raised
    numpy's OverflowError where the columns were built (Flight Recorder JSON, NCCL Inspector logs)."""
    from pacectl.data import DATA_DIR

    files = sorted(p for p in (DATA_DIR / folder).iterdir() if p.is_file())
    for src in files:
        (tmp_path / src.name).write_bytes(src.read_bytes())
    bad = tmp_path / files[0].name
    raw = bad.read_bytes()
    assert intact in raw
    bad.write_bytes(raw.replace(intact, damage, 1))
    proc = _validate("--format", fmt, *(str(tmp_path / src.name) for src in files))
    _one_clean_line(proc, needle, str(bad))


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["+backend=0.5"], "backend=0.5: no such option of backend"),
        (["+backend=true"], "backend=true: no such option of backend"),
        (["trace=-1"], "trace=-1: no such option of trace"),
        (["cluster=0", "seed=1"], "cluster=0: no such option of cluster"),
        (["controller={a: 1}"], "controller={a: 1}: no such option of controller"),
        (["backend=null"], "backend=null: no such option of backend"),
        (["backend=[]"], "backend=[]: no such option of backend"),  # composed, then crashed in the run
        (["+analysis=[1,2]"], "analysis=[1,2]: no such option of analysis"),  # TypeError (case 483)
    ],
)
def test_config_group_given_a_number_is_one_line(tmp_path: Path, argv: list[str], needle: str) -> None:
    """A config group given a number, bool or null raised Hydra's bare ValueError("Config group
    override must be a string or a list") out of the command-line check (campaign overrides cases
    90, 93, 187, 235, 256, 284); a dict suggested itself ("did you mean controller={a: 1}?"); an
    empty list selected no option and the run crashed on the missing section."""
    from pacectl.run import main
    from pacectl.testing.commands import run_command

    proc = run_command(main, argv, cwd=tmp_path)
    _one_clean_line(proc, needle, "available:")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "outputs").exists()


def test_an_nccl_inspector_number_too_long_for_python_is_one_line(tmp_path: Path) -> None:
    """json.loads refuses an integer of more than 4,300 digits with a ValueError (not a JSONDecodeError)."""
    from pacectl.data import DATA_DIR

    files = sorted(p for p in (DATA_DIR / "nccl-inspector" / "plain").iterdir() if p.is_file())
    for src in files:
        (tmp_path / src.name).write_bytes(src.read_bytes())
    bad = tmp_path / files[0].name
    bad.write_bytes(
        bad.read_bytes().replace(b'"coll_exec_time_us": 1000', b'"coll_exec_time_us": ' + b"9" * 5000, 1)
    )
    proc = _validate("--format", "nccl_inspector", *(str(tmp_path / src.name) for src in files))
    _one_clean_line(proc, "got a number too long to read (Exceeds the limit", str(bad))
