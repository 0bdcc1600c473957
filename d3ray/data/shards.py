"""Find corpus shards and stream their lines, from any filesystem fsspec opens.

A shard is one ``.jsonl``, ``.jsonl.zst`` or ``.jsonl.gz`` file. :func:`list_shards` expands
folders, globs and URIs (local paths, ``file://``, ``memory://``, ``s3://``, ``gs://``, ``hf://``
with the matching fsspec backend installed) into a deterministic, sorted list. :func:`iter_shard_lines`
streams one shard's lines as bytes in bounded memory: decompression is incremental, and a line
longer than a limit is skipped rather than held.

Compressed streams are decoded by hand (``zstandard.ZstdDecompressor.decompressobj``, ``gzip``)
because ``zstandard``'s stream reader ends silently on a truncated frame; here a truncated or
corrupt stream raises :class:`TruncatedStreamError` after every complete line before it.
"""

from __future__ import annotations

import gzip
import logging
import posixpath
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO

import fsspec
import zstandard
from fsspec.implementations.local import LocalFileSystem

from d3ray.errors import DataPathError

logger = logging.getLogger(__name__)

SHARD_SUFFIXES = (".jsonl", ".jsonl.zst", ".jsonl.gz")
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

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Shard:
        return cls(uri=str(data["uri"]), name=str(data["name"]), folder=str(data["folder"]))


class TruncatedStreamError(Exception):
    """A compressed shard ends inside a frame, or its compressed bytes are corrupt."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


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
    if isinstance(paths, str):
        paths = [paths]
    shards: list[Shard] = []
    seen_uris: set[str] = set()
    by_name: dict[str, str] = {}
    for path in paths:
        for shard in _list_one(path):
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
    return shards


def _list_one(path: str) -> list[Shard]:
    fs, root = fsspec.core.url_to_fs(path)
    if any(ch in root for ch in "*?["):
        prefix = root[: min(root.index(ch) for ch in "*?[" if ch in root)]
        base = prefix.rstrip("/") if prefix.endswith("/") else posixpath.dirname(prefix)
        found = fs.glob(root)
        found = [p for p in found if fs.isfile(p)]
    elif fs.isdir(root):
        base = root.rstrip("/")
        found = fs.find(root)
    elif fs.isfile(root):
        base = posixpath.dirname(root)
        found = [root]
    else:
        raise DataPathError(f"no such file or folder: {path!r}")
    matches = sorted(p for p in found if p.endswith(SHARD_SUFFIXES))
    if not matches:
        raise DataPathError(
            f"{path!r} matches no shard file ({', '.join(SHARD_SUFFIXES)}); it matched {len(found)} other file(s)"
        )
    anchor = posixpath.dirname(base.rstrip("/"))
    local = isinstance(fs, LocalFileSystem)
    shards = []
    for p in matches:
        name = posixpath.relpath(p, anchor) if anchor else p.lstrip("/")
        uri = p if local else fs.unstrip_protocol(p)
        shards.append(Shard(uri=uri, name=name, folder=posixpath.basename(posixpath.dirname(p))))
    return shards


def iter_shard_lines(shard: Shard, max_line_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """Stream a shard's lines as ``(line_number, bytes)``, 1-based, newline stripped.

    A line longer than ``max_line_bytes`` is yielded as ``(line_number, None)`` and its bytes are
    discarded as they stream past. A last line without a newline is yielded as a line.

    Raises:
        TruncatedStreamError: after the last complete line, when a ``.zst`` stream ends inside a
            frame or a compressed stream is corrupt. The partial line before the cut is not yielded.
    """
    with fsspec.open(shard.uri, "rb") as raw:
        yield from _split_lines(_decompressed_chunks(raw, shard.uri), max_line_bytes)


def _decompressed_chunks(raw: BinaryIO, uri: str) -> Iterator[bytes]:
    if uri.endswith(".zst"):
        yield from _zstd_chunks(raw)
    elif uri.endswith(".gz"):
        yield from _gzip_chunks(raw)
    else:
        while chunk := raw.read(_READ_BYTES):
            yield chunk


def _zstd_chunks(raw: BinaryIO) -> Iterator[bytes]:
    dctx = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
    dobj = dctx.decompressobj()
    in_frame = False
    offset = 0
    while chunk := raw.read(_READ_BYTES):
        offset += len(chunk)
        while chunk:  # a chunk may hold the end of one frame and the start of the next
            in_frame = True
            try:
                out = dobj.decompress(chunk)
            except zstandard.ZstdError as err:
                raise TruncatedStreamError(
                    "truncated_zstd", f"corrupt zstd data near byte {offset}: {err}"
                ) from err
            if out:
                yield out
            if dobj.eof:
                chunk = dobj.unused_data
                dobj = dctx.decompressobj()
                in_frame = False
            else:
                chunk = b""
    if in_frame:
        raise TruncatedStreamError("truncated_zstd", f"zstd frame cut off at byte {offset}")


def _gzip_chunks(raw: BinaryIO) -> Iterator[bytes]:
    with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
        while True:
            try:
                chunk = gz.read(_READ_BYTES)
            except EOFError as err:
                raise TruncatedStreamError("truncated_gzip", f"gzip stream cut off: {err}") from err
            except (gzip.BadGzipFile, zlib.error) as err:
                raise TruncatedStreamError("truncated_gzip", f"corrupt gzip data: {err}") from err
            if not chunk:
                return
            yield chunk


def _split_lines(chunks: Iterator[bytes], max_line_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    pending: list[bytes] = []  # pieces of the current line, never more than max_line_bytes in all
    pending_bytes = 0
    oversized = False
    line_no = 0
    for chunk in chunks:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                piece = chunk[start:]
                if not oversized and pending_bytes + len(piece) > max_line_bytes:
                    oversized, pending, pending_bytes = True, [], 0
                if not oversized and piece:
                    pending.append(piece)
                    pending_bytes += len(piece)
                break
            line_no += 1
            piece = chunk[start:end]
            if oversized or pending_bytes + len(piece) > max_line_bytes:
                yield line_no, None
            elif pending:
                pending.append(piece)
                yield line_no, b"".join(pending)
            else:
                yield line_no, piece
            pending, pending_bytes, oversized = [], 0, False
            start = end + 1
    if pending or oversized:
        yield line_no + 1, None if oversized else b"".join(pending)
