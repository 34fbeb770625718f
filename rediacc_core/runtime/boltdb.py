"""Reading and writing a whole bolt database (bbolt's file format), for `rdc repo fork`.

dockerd and its containerd keep state in bolt files (volumes' metadata, containerd's metadata) whose
values name absolute paths; a fork rewrites them. A rewritten value may change length, so the file is
not patched in place: it is read whole (`read`) and written again compactly (`write`): two meta pages,
an empty freelist, every bucket in its own pages. bbolt opens such a file as any other.

    read(path) -> Database       # its root bucket (keys to bytes or nested Buckets), page size, txid
    write(path, database)        # replaces the file atomically, keeping its mode

Layout (little-endian, as bbolt writes it on the hosts rdc runs on): every page starts with a 16-byte
header (id u64, flags u16, count u16, overflow u32); a leaf's elements are (flags u32, pos u32,
ksize u32, vsize u32), a branch's (pos u32, ksize u32, page u64), `pos` counted from the element; a
nested bucket's value is (root page u64, sequence u64), followed by its own page when root is 0
(an inline bucket).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

_MAGIC = 0xED0CDAED
_VERSION = 2
_BRANCH, _LEAF, _META, _FREELIST = 0x01, 0x02, 0x04, 0x10
_BUCKET_FLAG = 0x01
_HEADER = struct.Struct("<QHHI")
_LEAF_ELEMENT = struct.Struct("<IIII")
_BRANCH_ELEMENT = struct.Struct("<IIQ")
_BUCKET_VALUE = struct.Struct("<QQ")
# magic, version, page size, flags, root (page, sequence), freelist page, page count, txid
_META_FIELDS = struct.Struct("<IIIIQQQQQ")


class BoltError(Exception):
    """The file is not a bolt database this module can read; the message says what is wrong."""


@dataclass
class Bucket:
    """A bucket's entries in key order on write: values are bytes or nested buckets."""

    items: dict[bytes, bytes | Bucket] = field(default_factory=dict)
    sequence: int = 0


@dataclass
class Database:
    """A whole bolt file: its root bucket, and the page size and last transaction it was written with."""

    root: Bucket
    page_size: int = 4096
    txid: int = 1


@dataclass(frozen=True)
class _Meta:
    page_size: int
    root: int
    sequence: int
    txid: int


def _fnv64a(data: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


def _meta_at(data: bytes, offset: int) -> _Meta | None:
    start = offset + _HEADER.size
    if len(data) < start + _META_FIELDS.size + 8:
        return None
    fields = _META_FIELDS.unpack_from(data, start)
    (checksum,) = struct.unpack_from("<Q", data, start + _META_FIELDS.size)
    if (
        fields[0] != _MAGIC
        or fields[1] != _VERSION
        or checksum != _fnv64a(data[start : start + _META_FIELDS.size])
    ):
        return None
    return _Meta(page_size=fields[2], root=fields[4], sequence=fields[5], txid=fields[8])


def _meta(data: bytes) -> _Meta:
    first = _meta_at(data, 0)
    # The second meta page lies one page on; with the first unreadable, bbolt assumes the OS's size.
    second = _meta_at(data, first.page_size if first else os.sysconf("SC_PAGE_SIZE"))
    found = [m for m in (first, second) if m is not None]
    if not found:
        raise BoltError("neither meta page is a valid bolt meta page")
    return max(found, key=lambda m: m.txid)  # bbolt's rule: the newer valid meta page


def _read_page(data: bytes, offset: int, into: Bucket, page_size: int, depth: int) -> None:
    if depth > 64 or offset + _HEADER.size > len(data):
        raise BoltError(f"a page at offset {offset} lies outside the file or too deep")
    _, flags, count, _ = _HEADER.unpack_from(data, offset)
    for index in range(count):
        at = offset + _HEADER.size + index * _LEAF_ELEMENT.size
        if flags & _BRANCH:
            pos, ksize, child = _BRANCH_ELEMENT.unpack_from(data, at)
            _read_page(data, child * page_size, into, page_size, depth + 1)
        elif flags & _LEAF:
            element_flags, pos, ksize, vsize = _LEAF_ELEMENT.unpack_from(data, at)
            key = data[at + pos : at + pos + ksize]
            value = data[at + pos + ksize : at + pos + ksize + vsize]
            if len(key) != ksize or len(value) != vsize:
                raise BoltError(f"an element at offset {at} runs past the end of the file")
            into.items[key] = (
                _read_bucket(data, value, page_size, depth) if element_flags & _BUCKET_FLAG else value
            )
        else:
            raise BoltError(f"the page at offset {offset} is neither a branch nor a leaf (flags {flags:#x})")


def _read_bucket(data: bytes, value: bytes, page_size: int, depth: int) -> Bucket:
    root, sequence = _BUCKET_VALUE.unpack_from(value)
    bucket = Bucket(sequence=sequence)
    if root == 0:  # inline: its one page follows the bucket header inside the value
        _read_page(value, _BUCKET_VALUE.size, bucket, page_size, depth + 1)
    else:
        _read_page(data, root * page_size, bucket, page_size, depth + 1)
    return bucket


def read(path: Path) -> Database:
    """The bolt file at `path`, whole."""
    data = path.read_bytes()
    meta = _meta(data)
    root = Bucket(sequence=meta.sequence)
    _read_page(data, meta.root * meta.page_size, root, meta.page_size, 0)
    return Database(root, meta.page_size, meta.txid)


class _Writer:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.pages: list[bytes] = []  # from page 3 on: 0 and 1 are the meta pages, 2 the freelist

    def _add(self, flags: int, count: int, body: bytes) -> int:
        page_id = 3 + len(self.pages)
        size = _HEADER.size + len(body)
        spans = max(1, -(-size // self.page_size))
        page = _HEADER.pack(page_id, flags, count, spans - 1) + body
        self.pages.append(page.ljust(spans * self.page_size, b"\0"))
        self.pages.extend(b"" for _ in range(spans - 1))  # the overflow pages, already in `page`
        return page_id

    def _pages(self, flags: int, elements: list[tuple[bytes, bytes, int]]) -> list[tuple[bytes, int]]:
        """Pack elements (key, value, leaf flags or child page) into pages of one level; returns
        each page's first key and id."""
        made: list[tuple[bytes, int]] = []
        group: list[tuple[bytes, bytes, int]] = []
        used = _HEADER.size

        def flush() -> None:
            heads, tails = b"", b""
            for index, (key, value, extra) in enumerate(group):
                pos = (len(group) - index) * _LEAF_ELEMENT.size + len(tails)
                if flags == _LEAF:
                    heads += _LEAF_ELEMENT.pack(extra, pos, len(key), len(value))
                else:
                    heads += _BRANCH_ELEMENT.pack(pos, len(key), extra)
                tails += key + value
            made.append((group[0][0] if group else b"", self._add(flags, len(group), heads + tails)))

        for element in elements:
            size = _LEAF_ELEMENT.size + len(element[0]) + len(element[1])
            if group and used + size > self.page_size:
                flush()
                group, used = [], _HEADER.size
            group.append(element)
            used += size
        if group or not made:
            flush()
        return made

    def bucket(self, bucket: Bucket) -> int:
        """Write `bucket` and what it holds; returns its root page."""
        elements = []
        for key in sorted(bucket.items):
            value = bucket.items[key]
            if isinstance(value, Bucket):
                elements.append((key, _BUCKET_VALUE.pack(self.bucket(value), value.sequence), _BUCKET_FLAG))
            else:
                elements.append((key, value, 0))
        level = self._pages(_LEAF, elements)
        while len(level) > 1:
            level = self._pages(_BRANCH, [(key, b"", page) for key, page in level])
        return level[0][1]


def _meta_page(page_id: int, page_size: int, root: int, sequence: int, count: int, txid: int) -> bytes:
    fields = _META_FIELDS.pack(_MAGIC, _VERSION, page_size, 0, root, sequence, 2, count, txid)
    page = _HEADER.pack(page_id, _META, 0, 0) + fields + struct.pack("<Q", _fnv64a(fields))
    return page.ljust(page_size, b"\0")


def write(path: Path, database: Database) -> None:
    """Write `database` as the bolt file `path` (replaced atomically, keeping its mode)."""
    size = database.page_size
    writer = _Writer(size)
    root_page = writer.bucket(database.root)
    count = 3 + len(writer.pages)
    freelist = _HEADER.pack(2, _FREELIST, 0, 0).ljust(size, b"\0")
    sequence, txid = database.root.sequence, database.txid
    body = b"".join(
        [
            _meta_page(0, size, root_page, sequence, count, txid),
            _meta_page(1, size, root_page, sequence, count, txid),
            freelist,
            *writer.pages,
        ]
    )
    staged = path.with_name(path.name + ".rdc-new")
    with open(staged, "wb") as out:
        out.write(body)
        out.flush()
        os.fchmod(out.fileno(), os.stat(path).st_mode & 0o7777 if path.exists() else 0o600)
        os.fsync(out.fileno())
    os.replace(staged, path)
