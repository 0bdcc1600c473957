"""Find corpus shards and stream their lines, from any filesystem fsspec opens.

A shard is one JSON file (``.jsonl``, ``.json``, ``.ndjson``; plain, ``.zst``/``.zstd``, ``.gz`` or ``.bz2``;
suffixes in any case), or one columnar file: ``.parquet``, or ``.arrow`` (the Arrow IPC stream files of a
``datasets.Dataset.save_to_disk`` folder; read by :mod:`d3ray.data.columnar`). :func:`list_corpus` expands
folders, globs and URIs (local paths, ``file://``, ``memory://``, ``s3://``, ``gs://``, ``hf://``
with the matching fsspec backend installed) into a deterministic, sorted list, and names every other file
found (:class:`Listing`, one warning line for the caller to log). :func:`iter_shard_lines` streams one JSON
shard's lines as bytes in bounded memory: decompression is incremental, and a line longer than a limit is
skipped rather than held. A ``.json`` file whose first non-blank byte is ``[`` is a top-level array of
records (as ``datasets``' json loader reads it): parsed whole, each record comes as one line of JSON.

Compressed streams are decoded by hand (``zstandard.ZstdDecompressor.decompressobj``, ``zlib``, ``bz2``),
one zstd frame, gzip member or bz2 stream at a time, because ``zstandard``'s stream reader ends silently on a
truncated frame and because frame starts are where a reader can resume: every line comes with its
:class:`ShardPosition` (line number, decompressed offset, and the frame it starts in), and
``iter_shard_lines(shard, ..., start=position)`` seeks there instead of re-reading the shard. A
truncated or corrupt stream raises :class:`TruncatedStreamError` after every complete line before it.
"""

from __future__ import annotations

import bz2
import itertools
import json
import logging
import posixpath
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO, NamedTuple

import fsspec
import zstandard
from fsspec.implementations.local import LocalFileSystem

from d3ray.errors import DataPathError

logger = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".jsonl.zst", ".jsonl.gz")  # line-delimited JSON, as eval inputs read it
#: Record files of JSON text: JSON Lines, or (``.json``) a top-level array of records, as ``datasets``' json
#: loader reads them; each optionally compressed (COMPRESSION_SUFFIXES). Suffixes match in any case.
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
COMPRESSION_SUFFIXES = (".zst", ".zstd", ".gz", ".bz2")
COLUMNAR_SUFFIXES = (".parquet", ".arrow")
SHARD_SUFFIXES = (*(j + c for j in JSON_SUFFIXES for c in ("", *COMPRESSION_SUFFIXES)), *COLUMNAR_SUFFIXES)
#: Said in messages: the file kinds read as shards.
SHARD_KINDS = ".jsonl/.json/.ndjson (plain, .zst, .zstd, .gz or .bz2), .parquet, .arrow"
HF_DATASET_DICT_FILE = "dataset_dict.json"  # the root of a saved DatasetDict: one folder per split
HF_STATE_FILE = "state.json"  # beside a saved Dataset's data-*.arrow files (save_to_disk)
#: A saved Dataset's own description of its files (read by ``datasets``, not records): part of the folder.
HF_SAVED_METADATA = ("state.json", "dataset_info.json")
_READ_BYTES = 1 << 20  # compressed bytes per read call
_ZSTD_MAX_WINDOW = 1 << 31


@dataclass(frozen=True)
class Shard:
    """One shard file.

    ``name`` is the shard's stable id in sample ids and reports: its path relative to the parent of
    the folder it was listed from (``train/chunk1/example_train_0.jsonl.zst``), so ids do not change
    when the corpus moves to another mount or bucket. ``folder`` is the name of the folder holding
    the file, which is the domain in the RedPajama-1T layout.
    """

    uri: str
    name: str
    folder: str
    domain: str = ""
    """The domain its listing gives it in layout ``path`` (its data path's, or its subfolder's, name; set by
    :func:`d3ray.data.corpus.assign_path_domains`); ``""`` in the other layouts."""

    @property
    def columnar(self) -> bool:
        """Whether the shard is a parquet or Arrow IPC file (rows, not lines)."""
        return self.uri.lower().endswith(COLUMNAR_SUFFIXES)

    @property
    def compression(self) -> str:
        """``zst``, ``gz``, ``bz2`` or ``""`` (plain), by the file's last suffix (``.zstd`` is ``zst``)."""
        ext = posixpath.splitext(self.uri.lower())[1]
        return {".zst": "zst", ".zstd": "zst", ".gz": "gz", ".bz2": "bz2"}.get(ext, "")

    @property
    def maybe_array(self) -> bool:
        """Whether the file may hold a top-level JSON array rather than JSON Lines (a ``.json`` file)."""
        base = self.uri.lower()
        for ext in COMPRESSION_SUFFIXES:
            base = base.removesuffix(ext)
        return base.endswith(".json")

    @property
    def stem(self) -> str:
        """The file name without its shard suffix (``web.jsonl.zst`` → ``web``): the domain in layout ``file``."""
        base = posixpath.basename(self.uri)
        for suffix in sorted(SHARD_SUFFIXES, key=len, reverse=True):
            if base.lower().endswith(suffix):
                return base[: -len(suffix)]
        return base

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Shard:
        return cls(uri=str(data["uri"]), name=str(data["name"]), folder=str(data["folder"]),
                   domain=str(data.get("domain", "")))


@dataclass(frozen=True)
class Listing:
    """What a list of data paths holds: the shards (in order), each path's own shards, and the files under
    them that are not read (not a shard kind), by name."""

    shards: list[Shard]
    groups: list[tuple[str, list[Shard]]]
    """(path as given, its shards not listed by an earlier path), in the order of the paths."""
    ignored: list[str]
    """Files under the paths that are no shard, named as shards are (relative to the listed folder's parent)."""

    def ignored_line(self, field: str) -> str:
        """One line naming the files not read (count and the first names), or ``""`` when there are none."""
        if not self.ignored:
            return ""
        first = ", ".join(self.ignored[:5]) + (f" and {len(self.ignored) - 5} more" if len(self.ignored) > 5 else "")
        return (f"{field}: {len(self.ignored)} file(s) not read, not of a kind d3ray reads ({SHARD_KINDS}): {first}; "
                "convert them, or move them out of the data folder")


class TruncatedStreamError(Exception):
    """A compressed shard ends inside a frame, or its compressed bytes are corrupt."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.position: ShardPosition | None = None  # where the cut line starts (set by the line splitter)


def list_shards(paths: str | Sequence[str]) -> list[Shard]:
    """Expand folders, globs and URIs into shards, in a deterministic order.

    Each path contributes its shards sorted by path; paths keep the order given, and a shard
    matched twice is listed once.

    Args:
        paths: one path or several; each a folder (searched recursively), a glob, or a file,
            local or any fsspec URI.

    Returns:
        The shards, each with a unique ``name``.

    Raises:
        FileNotFoundError: a path matches no shard file.
        ValueError: two different files would get the same shard name.
    """
    return list_corpus(paths).shards


def list_corpus(paths: str | Sequence[str]) -> Listing:
    """:func:`list_shards`, with each path's shards and the files found that are not shards (see :class:`Listing`).

    Raises:
        FileNotFoundError: a path matches no shard file.
        ValueError: two different files would get the same shard name.
    """
    if isinstance(paths, str):
        paths = [paths]
    shards: list[Shard] = []
    groups: list[tuple[str, list[Shard]]] = []
    ignored: list[str] = []
    seen_uris: set[str] = set()
    by_name: dict[str, str] = {}
    for path in paths:
        found, skipped = _list_one(path)
        ignored += [name for name in skipped if name not in ignored]
        group: list[Shard] = []
        groups.append((path, group))
        for shard in found:
            if shard.uri in seen_uris:
                continue
            if shard.name in by_name:
                raise ValueError(
                    f"two shards would share the name {shard.name!r}: {by_name[shard.name]} and {shard.uri}; "
                    "list them from folders with different names"
                )
            seen_uris.add(shard.uri)
            by_name[shard.name] = shard.uri
            shards.append(shard)
            group.append(shard)
    return Listing(shards, groups, ignored)


def _is_shard(path: str) -> bool:
    return path.lower().endswith(SHARD_SUFFIXES)


def _list_one(path: str) -> tuple[list[Shard], list[str]]:
    fs, root = fsspec.core.url_to_fs(path)
    if any(ch in root for ch in "*?["):
        prefix = root[: min(root.index(ch) for ch in "*?[" if ch in root)]
        base = prefix.rstrip("/") if prefix.endswith("/") else posixpath.dirname(prefix)
        found = fs.glob(root)
        found = [p for p in found if fs.isfile(p)]
    elif fs.isdir(root):
        base = root.rstrip("/")
        if fs.isfile(posixpath.join(base, HF_DATASET_DICT_FILE)):
            splits = sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(base, detail=False) if fs.isdir(p))
            raise DataPathError(f"{path!r} is a saved Hugging Face DatasetDict (splits {splits}); give the "
                                f"split to read, e.g. {posixpath.join(path, splits[0] if splits else 'train')!r}")
        found = fs.find(root)
    elif fs.isfile(root):
        base = posixpath.dirname(root)
        found = [root]
    else:
        raise DataPathError(f"no such file or folder: {path!r}")
    saved = {posixpath.dirname(p) for p in found if posixpath.basename(p) == HF_STATE_FILE}
    metadata = {p for p in found if posixpath.dirname(p) in saved and posixpath.basename(p) in HF_SAVED_METADATA}
    matches = sorted(p for p in found if _is_shard(p) and p not in metadata)
    anchor = posixpath.dirname(base.rstrip("/"))

    def name_of(p: str) -> str:
        return posixpath.relpath(p, anchor) if anchor else p.lstrip("/")

    others = sorted(name_of(p) for p in found if p not in metadata and not _is_shard(p))
    if not matches:
        raise DataPathError(
            f"{path!r} matches no shard file ({SHARD_KINDS}); it matched {len(others)} other file(s)"
            + (f": {', '.join(others[:5])}" if others else ""))
    local = isinstance(fs, LocalFileSystem)
    shards = []
    for p in matches:
        uri = p if local else fs.unstrip_protocol(p)
        shards.append(Shard(uri=uri, name=name_of(p), folder=posixpath.basename(posixpath.dirname(p))))
    return shards, others


@dataclass(frozen=True)
class ShardPosition:
    """A line start inside a shard, from which reading can resume without re-reading the lines before.

    ``line`` is the 1-based number of the line that starts at ``offset`` (a byte offset in the
    decompressed stream). ``frame_offset`` is the compressed byte offset where decompression can
    restart (the start of the zstd frame or gzip member holding that line; ``offset`` itself for a
    plain file) and ``frame_start`` the decompressed offset of that frame's first byte. Resuming
    seeks to ``frame_offset`` and decompresses and discards ``offset - frame_start`` bytes: nothing
    for a plain file, at most one frame for ``.zst`` (SlimPajama's shards are one frame each, so up
    to the whole shard is decompressed again, but never parsed or tokenized), at most one member
    for ``.gz`` (a plain ``gzip`` file is one member).

    In a columnar shard (parquet, arrow) a record is a row: ``line`` is its 1-based row number,
    ``offset`` its 0-based row index, ``frame_offset`` the index of the parquet row group (Arrow record
    batch) holding it and ``frame_start`` that group's first row index; resuming opens that group and
    skips ``offset - frame_start`` rows of it.
    """

    line: int = 1
    offset: int = 0
    frame_offset: int = 0
    frame_start: int = 0

    def to_list(self) -> list[int]:
        return [self.line, self.offset, self.frame_offset, self.frame_start]

    @classmethod
    def from_list(cls, data: Sequence[int]) -> ShardPosition:
        line, offset, frame_offset, frame_start = (int(v) for v in data)
        if line < 1 or offset < frame_start or min(offset, frame_offset, frame_start) < 0:
            raise ValueError(f"not a shard position: {list(data)}")
        return cls(line, offset, frame_offset, frame_start)


class ShardLine(NamedTuple):
    """One line of a shard: its number, its bytes (None when oversized) and where it starts."""

    number: int
    data: bytes | None
    offset: int
    frame_offset: int
    frame_start: int

    @property
    def position(self) -> ShardPosition:
        return ShardPosition(self.number, self.offset, self.frame_offset, self.frame_start)


def iter_shard_lines(
    shard: Shard, max_line_bytes: int, start: ShardPosition | None = None
) -> Iterator[ShardLine]:
    """Stream a shard's lines, 1-based, newline stripped, from its start or from ``start``.

    A line longer than ``max_line_bytes`` comes with ``data=None``; its bytes are discarded as they
    stream past. A last line without a newline is yielded as a line.

    Raises:
        TruncatedStreamError: after the last complete line, when a ``.zst`` stream ends inside a
            frame or a compressed stream is corrupt. The partial line before the cut is not yielded;
            the error's ``position`` says where it started.
    """
    if shard.columnar:
        raise ValueError(f"{shard.name} is a columnar shard: read its rows with d3ray.data.columnar, not lines")
    start = start or ShardPosition()
    compression = shard.compression
    plain = not compression
    with fsspec.open(shard.uri, "rb") as raw:
        if shard.maybe_array and not start.frame_offset:
            # A .json file: JSON Lines, or one top-level array (its first non-blank byte is "["). Either is read
            # from the file's start; an array's records resume by index (ShardPosition of _array_lines).
            chunks = _chunks(raw, ShardPosition(), compression)
            head, chunks = _peek(chunks)
            if head == b"[":
                yield from _array_lines(chunks, max_line_bytes, start.offset)
                return
        else:
            if start.frame_offset:
                raw.seek(start.frame_offset)
            chunks = _chunks(raw, start, compression)
        yield from _split_lines(chunks, max_line_bytes, start, plain=plain)


def _chunks(raw: BinaryIO, start: ShardPosition, compression: str) -> Iterator[tuple[bytes, int, int]]:
    if compression == "zst":
        return _framed_chunks(raw, start, _zstd_frames())
    if compression == "gz":
        return _framed_chunks(raw, start, _gzip_members())
    if compression == "bz2":
        return _framed_chunks(raw, start, _bz2_streams())
    return _plain_chunks(raw, start)


def _peek(chunks: Iterator[tuple[bytes, int, int]]) -> tuple[bytes, Iterator[tuple[bytes, int, int]]]:
    """The first non-whitespace byte of the stream (``b""`` if none) and the stream, unchanged."""
    seen: list[tuple[bytes, int, int]] = []
    head = b""
    for chunk in chunks:
        seen.append(chunk)
        stripped = chunk[0].lstrip()
        if stripped:
            head = stripped[:1]
            break
    return head, itertools.chain(seen, chunks)


def _array_lines(chunks: Iterator[tuple[bytes, int, int]], max_line_bytes: int, skip: int) -> Iterator[ShardLine]:
    """The records of a top-level JSON array, each as one line of JSON (its index as line - 1 and offset).

    The array is parsed whole, as ``datasets``' json loader does. A file that is not valid JSON is one
    record (line 1) holding its bytes, so that it counts as one ``malformed_json`` record with the parser's
    message (or as ``oversized_record``).
    """
    data = b"".join(c[0] for c in chunks)
    try:
        items = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        if skip == 0:
            yield ShardLine(1, data if len(data) <= max_line_bytes else None, 0, 0, 0)
        return
    for i, item in enumerate(items):
        if i < skip:
            continue
        line = json.dumps(item).encode()  # ASCII: a lone surrogate stays an escape, judged as the text
        yield ShardLine(i + 1, line if len(line) <= max_line_bytes else None, i, 0, 0)


def _plain_chunks(raw: BinaryIO, start: ShardPosition) -> Iterator[tuple[bytes, int, int]]:
    if start.frame_offset != start.offset:
        raise ValueError(f"a plain shard resumes at a line start, not inside a frame: {start}")
    while chunk := raw.read(_READ_BYTES):
        yield chunk, 0, 0


class _Frames:
    """Decompressor factory and error naming of one compressed format (zstd frames, gzip members)."""

    def __init__(self, reason: str, errors: tuple[type[Exception], ...], new: Any) -> None:
        self.reason, self.errors, self.new = reason, errors, new


def _zstd_frames() -> _Frames:
    dctx = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
    return _Frames("truncated_zstd", (zstandard.ZstdError,), dctx.decompressobj)


def _gzip_members() -> _Frames:
    return _Frames("truncated_gzip", (zlib.error,), lambda: zlib.decompressobj(wbits=31))


def _bz2_streams() -> _Frames:
    return _Frames("truncated_bz2", (OSError, ValueError, EOFError), bz2.BZ2Decompressor)


def _framed_chunks(raw: BinaryIO, start: ShardPosition, frames: _Frames) -> Iterator[tuple[bytes, int, int]]:
    """Decompressed chunks, each with the (compressed, decompressed) offsets of its frame's start.

    Frames (zstd) and members (gzip) are decompressed one at a time, so that every frame start is a
    position to resume from. Ends inside a frame, or corrupt data, raise TruncatedStreamError.
    """
    dobj = frames.new()
    in_frame = False
    consumed = start.frame_offset  # compressed bytes before the end of the current read
    frame_c, frame_d = start.frame_offset, start.frame_start
    produced = start.frame_start  # decompressed bytes before the current frame's next output
    kind = {"truncated_zstd": "zstd frame", "truncated_gzip": "gzip member"}.get(frames.reason, "bz2 stream")
    while chunk := raw.read(_READ_BYTES):
        consumed += len(chunk)
        while chunk:  # a chunk may hold the end of one frame and the start of the next
            if not in_frame:
                if frames.reason != "truncated_zstd" and not chunk.strip(b"\x00"):
                    break  # zero padding after the last member, as gzip allows
                in_frame = True
                frame_c, frame_d = consumed - len(chunk), produced
            try:
                out = dobj.decompress(chunk)
            except frames.errors as err:
                raise TruncatedStreamError(
                    frames.reason, f"corrupt {kind} data near byte {consumed}: {err}"
                ) from err
            if out:
                yield out, frame_c, frame_d
                produced += len(out)
            if dobj.eof:
                chunk = dobj.unused_data
                dobj = frames.new()
                in_frame = False
            else:
                chunk = b""
    if in_frame:
        raise TruncatedStreamError(frames.reason, f"{kind} cut off at byte {consumed}")


def _split_lines(
    chunks: Iterator[tuple[bytes, int, int]], max_line_bytes: int, start: ShardPosition, plain: bool
) -> Iterator[ShardLine]:
    pending: list[bytes] = []  # pieces of the current line, never more than max_line_bytes in all
    pending_bytes = 0
    oversized = False
    line_no = start.line - 1
    pos = start.frame_start  # decompressed offset of the current chunk's first byte
    line_start = start.offset
    # (compressed, decompressed) start of the frame holding the current line's first byte; None
    # until that byte is seen (a line may start in the next chunk, which may be the next frame).
    line_frame: tuple[int, int] | None = None
    last_frame = (start.frame_offset, start.frame_start)
    try:
        for chunk, frame_c, frame_d in chunks:
            last_frame = (frame_c, frame_d)
            at = 0
            if pos < start.offset:  # seeking: discard the decompressed bytes before the start
                at = min(len(chunk), start.offset - pos)
            while at < len(chunk):
                if line_frame is None:
                    line_frame = (line_start, line_start) if plain else (frame_c, frame_d)
                end = chunk.find(b"\n", at)
                if end < 0:
                    piece = chunk[at:]
                    if not oversized and pending_bytes + len(piece) > max_line_bytes:
                        oversized, pending, pending_bytes = True, [], 0
                    if not oversized:
                        pending.append(piece)
                        pending_bytes += len(piece)
                    break
                line_no += 1
                piece = chunk[at:end]
                if oversized or pending_bytes + len(piece) > max_line_bytes:
                    data = None
                elif pending:
                    pending.append(piece)
                    data = b"".join(pending)
                else:
                    data = piece
                yield ShardLine(line_no, data, line_start, *line_frame)
                pending, pending_bytes, oversized, line_frame = [], 0, False, None
                line_start = pos + end + 1
                at = end + 1
            pos += len(chunk)
    except TruncatedStreamError as err:
        frame = line_frame or ((line_start, line_start) if plain else last_frame)
        err.position = ShardPosition(line_no + 1, line_start, *frame)
        raise
    if pending or oversized:
        frame = line_frame or last_frame
        yield ShardLine(line_no + 1, None if oversized else b"".join(pending), line_start, *frame)
