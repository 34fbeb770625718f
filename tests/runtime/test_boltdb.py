"""A bolt database is read whole and written again whole, keeping every bucket, key, value and
sequence; what is written is a valid bolt file (checked meta pages, leaves, branches, overflow).

That dockerd and containerd open the rewritten files is shown on real engines (tests/e2e/test_e2e_fork.py).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from rediacc_core.runtime import boltdb
from rediacc_core.runtime.boltdb import BoltError, Bucket, Database

PAGE = 4096


def _tree() -> Bucket:
    many = Bucket({f"key-{i:05d}".encode(): f"value {i}".encode() * 3 for i in range(2000)}, sequence=7)
    return Bucket(
        {
            b"volumes": Bucket({b"vb": b'{"Name":"vb","Options":{"device":"/run/p/1-2"}}'}, sequence=2),
            b"many": many,  # more than a page: leaves under branch pages
            b"big": Bucket({b"blob": bytes(range(256)) * 100}),  # one value over several pages
            b"empty": Bucket(),
            b"v1": Bucket(
                {b"moby": Bucket({b"containers": Bucket({b"c1": Bucket({b"spec": b"\x0a\x03abc"})})})}
            ),
            b"version": b"\x08",
        },
        sequence=3,
    )


def _blank(path: Path, txid: int = 41) -> None:
    boltdb.write(path, Database(Bucket(), PAGE, txid))


def test_what_is_written_reads_back_the_same(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    boltdb.write(db, Database(_tree(), PAGE, 41))
    assert boltdb.read(db) == Database(_tree(), PAGE, 41)
    assert db.stat().st_size % PAGE == 0


def test_a_rewrite_keeps_the_page_size_the_transaction_and_the_mode(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    boltdb.write(db, Database(_tree(), 16384, 99))
    db.chmod(0o640)
    database = boltdb.read(db)
    database.root.items[b"version"] = b"\x09"
    boltdb.write(db, database)
    data = db.read_bytes()
    magic, version, page_size = struct.unpack_from("<III", data, 16)
    (txid,) = struct.unpack_from("<Q", data, 16 + 48)
    assert (magic, version, page_size, txid) == (0xED0CDAED, 2, 16384, 99)
    assert db.stat().st_mode & 0o777 == 0o640
    assert boltdb.read(db).root.items[b"version"] == b"\x09"


def test_an_inline_bucket_is_read(tmp_path: Path) -> None:
    """bbolt keeps a small bucket inside its parent's value: its header with root 0, then its page."""
    db = tmp_path / "inline.db"
    _blank(db)
    inline_page = struct.pack("<QHHI", 0, 0x02, 1, 0) + struct.pack("<IIII", 0, 16, 1, 2) + b"kv1"
    value = struct.pack("<QQ", 0, 5) + inline_page
    raw = bytearray(db.read_bytes())
    root_page = 3  # the writer's root leaf: rewrite it by hand as one bucket element
    leaf = (
        struct.pack("<QHHI", root_page, 0x02, 1, 0)
        + struct.pack("<IIII", 1, 16, 6, len(value))
        + b"bucket"
        + value
    )
    raw[root_page * PAGE : root_page * PAGE + len(leaf)] = leaf
    db.write_bytes(bytes(raw))
    assert boltdb.read(db).root == Bucket({b"bucket": Bucket({b"k": b"v1"}, sequence=5)})


@pytest.mark.parametrize("damage", ["magic", "checksum"])
def test_a_file_whose_meta_pages_do_not_check_is_refused(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "meta.db"
    _blank(db)
    raw = bytearray(db.read_bytes())
    for page in (0, PAGE):
        at = page + 16 + (0 if damage == "magic" else 40)  # the magic, or the page count it checks
        raw[at] ^= 0xFF
    db.write_bytes(bytes(raw))
    with pytest.raises(BoltError, match="meta page"):
        boltdb.read(db)


def test_the_newer_valid_meta_page_wins(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    _blank(db, txid=5)
    raw = bytearray(db.read_bytes())
    raw[16 + 40] ^= 0xFF  # the first meta page no longer checks: the second is used
    db.write_bytes(bytes(raw))
    assert boltdb.read(db).root == Bucket()
