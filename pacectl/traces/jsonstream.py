"""Bounded-memory reading of large (optionally gzipped) Chrome-trace JSON files.

``json.load`` builds the whole document tree before anything can be dropped; a 1 GB Kineto trace then
needs several GB of Python objects. :func:`stream_events` instead decodes the top-level object one
key at a time and the ``traceEvents`` array one event at a time (``json.JSONDecoder.raw_decode`` on a
sliding text window), hands each event to a callback that keeps only what it needs, and forgets it.
Peak memory is the window (a few MiB) plus what the callback keeps.

It also classifies failures, which ``json.load`` cannot: a file that simply *ends* early (a truncated
gzip, a profile killed while writing) is reported as :class:`Truncated` after every complete event has
been delivered, so the caller can recover; a file that is malformed *inside* raises
:class:`~pacectl.errors.TraceError` with the character offset and the index of the last good event.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pacectl.errors import TraceError
from pacectl.traces.detect import detect_format

#: Default cap on a trace file's size on disk and on its decompressed text, bytes (1 GiB).
DEFAULT_MAX_BYTES = 1 << 30
_READ_BYTES = 1 << 20  # read granularity (decompressed), bytes
_MAX_VALUE_CHARS = 64 << 20  # one JSON value (event or metadata) larger than this is corrupt
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _mib(num_bytes: int) -> str:
    """``num_bytes`` in MiB, as ``trace.max_mb`` counts them: ``1024 MiB (1073741824 bytes)``."""
    return f"{num_bytes / (1 << 20):.4g} MiB ({num_bytes} bytes)"


@dataclass(frozen=True)
class Truncated:
    """How a truncated file ended.

    Attributes:
        offset: character offset where the text ran out.
        reason: ``"gzip stream ended early"`` or ``"text ended inside the JSON document"``.
        in_events: whether the cut fell inside the event array (so metadata after it is lost).
    """

    offset: int
    reason: str
    in_events: bool


@dataclass(frozen=True)
class StreamResult:
    """What :func:`stream_events` read.

    Attributes:
        meta: top-level keys other than ``traceEvents`` (empty for a bare event list).
        num_events: events delivered to the callback.
        truncated: set when the file ended early (all complete events were still delivered).
    """

    meta: dict[str, Any]
    num_events: int
    truncated: Truncated | None


def _starts_with(path: Path, magic: bytes) -> bool:
    """Whether the file at ``path`` begins with ``magic`` (False when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


def _byte_at(path: Path, offset: int) -> str:
    """The byte at ``offset`` of the (decompressed) file as an escape (``'\\x8f'``): where the
    decoder put U+FFFD for a byte that is not UTF-8. ``offset`` counts characters, which are bytes
    here: only whitespace comes before the first character of the document."""
    try:
        with path.open("rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream: Any = gzip.GzipFile(fileobj=raw) if gz else raw
            stream.read(offset)
            byte = stream.read(1)
    except (OSError, EOFError, zlib.error):
        byte = b""
    return repr(byte)[1:] if byte else "a byte that is not UTF-8"


class _EndOfData(Exception):
    """The text ended before the JSON document did."""


class _Corrupt(Exception):
    def __init__(self, offset: int, what: str) -> None:
        super().__init__(what)
        self.offset = offset
        self.what = what


def _chunks(path: Path, max_bytes: int, state: dict[str, Any]) -> Iterator[str]:
    """Decoded text of ``path`` in pieces; gzip is detected from the magic bytes, not the name."""
    with path.open("rb") as raw:
        magic = raw.read(2)
        raw.seek(0)
        stream: Any = gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            try:
                block = stream.read(_READ_BYTES)
            except EOFError:
                state["gzip_truncated"] = True
                break
            except (gzip.BadGzipFile, zlib.error, OSError) as err:
                raise TraceError(
                    f"a gzip trace file must decompress cleanly, got {type(err).__name__}: {err} after "
                    f"{state['bytes']} decompressed bytes (in {path}). Re-copy or re-export the file."
                ) from err
            if not block:
                break
            state["bytes"] += len(block)
            if state["bytes"] > max_bytes:
                raise TraceError(
                    f"decompressed trace text must be <= {_mib(max_bytes)} (trace.max_mb), got more than "
                    f"{_mib(state['bytes'])} (in {path}). Profile fewer steps (torch.profiler.schedule active=) "
                    "or raise the cap (--max-mb / trace.max_mb)."
                )
            yield decoder.decode(block)
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail


class _Reader:
    """A sliding window over the text with JSON value decoding that refills on demand."""

    def __init__(self, chunks: Iterator[str]) -> None:
        self._chunks = chunks
        self.buf = ""
        self.pos = 0
        self.dropped = 0  # characters discarded before ``buf``
        self.eof = False

    @property
    def offset(self) -> int:
        return self.dropped + self.pos

    def _more(self) -> bool:
        if self.eof:
            return False
        try:
            nxt = next(self._chunks)
        except StopIteration:
            self.eof = True
            return False
        if self.pos:
            self.dropped += self.pos
            self.buf = self.buf[self.pos :]
            self.pos = 0
        self.buf += nxt
        return True

    def peek(self) -> str:
        """Next non-whitespace character ('' at the end of the text)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def take(self, *expected: str, context: str) -> str:
        """Consume the next non-whitespace character, which must be one of ``expected``."""
        c = self.peek()
        if c == "":
            raise _EndOfData
        if c not in expected:
            raise _Corrupt(self.offset, f"expected {' or '.join(map(repr, expected))} {context}, got {c!r}")
        self.pos += 1
        return c

    def closed(self, close: str, context: str) -> bool:
        """Consume the ``,`` between two items (False) or the ``close`` after the last one (True)."""
        return self.take(",", close, context=context) == close

    def value(self) -> Any:
        """Decode one JSON value at the cursor."""
        if self.peek() == "":
            raise _EndOfData
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                need_more = err.pos >= len(self.buf) - 2 or err.msg.startswith("Unterminated string")
                if not need_more:
                    raise _Corrupt(self.dropped + err.pos, err.msg) from None
                if len(self.buf) - self.pos > _MAX_VALUE_CHARS:
                    raise _Corrupt(
                        self.offset, f"a JSON value longer than {_MAX_VALUE_CHARS} chars"
                    ) from None
                if not self._more():
                    raise _EndOfData from None
                continue
            if end >= len(self.buf) and not self.eof and self._more():
                continue  # a number or literal may continue in the next piece
            self.pos = end
            return obj


def stream_events(
    path: str | Path,
    on_event: Callable[[Any, int], None],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> StreamResult:
    """Stream the events of a Chrome-trace JSON file (object with ``traceEvents``, or a bare list).

    Args:
        path: ``.json`` or gzip-compressed file (detected by its magic bytes).
        on_event: called as ``on_event(event, index)`` for each element of the event array, in order;
            ``event`` is whatever JSON value the element holds (normally a dict).
        max_bytes: cap on the file size on disk and on the decompressed text, bytes.

    Returns:
        The top-level metadata and how the read ended (see :class:`StreamResult`).

    Raises:
        TraceError: the file is missing or too large, the gzip stream is corrupt, the document is not
            JSON (message names the character offset and the last good event), or it ends before the
            first event.
    """
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file must be an existing file, got {str(p)!r}. Check the path.")
    size = p.stat().st_size
    if size > max_bytes:
        raise TraceError(
            f"trace file size must be <= {_mib(max_bytes)} (trace.max_mb), got {_mib(size)} (in {p}). "
            "Profile fewer steps (torch.profiler.schedule active=) or raise the cap (--max-mb / trace.max_mb)."
        )
    if size == 0:
        raise TraceError(f"trace file must not be empty, got 0 bytes (in {p})")
    state: dict[str, Any] = {"bytes": 0, "gzip_truncated": False}
    reader = _Reader(_chunks(p, max_bytes, state))
    meta: dict[str, Any] = {}
    count = 0
    in_events = False

    def read_array() -> None:
        nonlocal count, in_events
        reader.take("[", context="to open the event array")
        in_events = True
        if reader.peek() == "]":
            reader.pos += 1
            in_events = False
            return
        while True:
            on_event(reader.value(), count)
            count += 1
            if reader.closed("]", f"after event #{count - 1}"):
                in_events = False
                return

    try:
        first = reader.peek()
        if first == "[":
            read_array()
        elif first == "{":
            reader.pos += 1
            if reader.peek() == "}":
                reader.pos += 1
            else:
                while True:
                    key = reader.value()
                    if not isinstance(key, str):
                        raise _Corrupt(reader.offset, f"expected a string key, got {key!r}")
                    reader.take(":", context=f"after key {key!r}")
                    if key == "traceEvents":
                        read_array()
                    else:
                        meta[key] = reader.value()
                    if reader.closed("}", f"after key {key!r}"):
                        break
        elif first == "":
            raise _EndOfData
        else:
            got = _byte_at(p, reader.offset) if first == "\ufffd" else repr(first)
            raise _Corrupt(reader.offset, f"a JSON trace must start with '{{' or '[', got {got}")
        rest = reader.peek()
        if rest != "":
            raise _Corrupt(reader.offset, f"extra data after the JSON document: {rest!r}")
    except _Corrupt as err:
        where = f"after event #{count - 1}" if count else "before the first event"
        advice = "The file is corrupt; re-export it from the profiler."
        if not count:  # nothing parsed: perhaps no Kineto file at all
            named, _ = detect_format(p)
            what = "a Parquet file (a canonical or ByteDance trace)" if _starts_with(p, b"PAR1") else None
            what = what or (f"a {named} trace by its name" if named not in (None, "kineto") else None)
            if what:
                advice = (
                    f"It looks like {what}, not Kineto JSON: read it as that (pacectl.run: trace=<file> "
                    "picks the format from the suffix; pacectl.traces: leave out --format)."
                )
        raise TraceError(
            f"trace file must be valid JSON; at character {err.offset} ({where}): {err.what} (in {p}). {advice}"
        ) from None
    except _EndOfData:
        reason = (
            "gzip stream ended early" if state["gzip_truncated"] else "text ended inside the JSON document"
        )
        if count == 0:
            raise TraceError(
                f"trace file must hold at least one complete event, got a file that ends early ({reason}) "
                f"at character {reader.offset} (in {p}). Re-copy the file."
            ) from None
        return StreamResult(meta, count, Truncated(offset=reader.offset, reason=reason, in_events=in_events))
    if state["gzip_truncated"]:  # the JSON closed but the gzip trailer is missing
        return StreamResult(meta, count, Truncated(reader.offset, "gzip stream ended early", in_events=False))
    return StreamResult(meta, count, None)
