"""Damaging one data page of an LMDB and nothing else: its two meta pages (the header `lmdb.open` reads) stay
valid, so the store opens and the damage shows only when a read reaches that page (`lmdb.CorruptedError`)."""
from __future__ import annotations

import os
import struct
from pathlib import Path

PAGE_HEADER = 16                 # pgno (8), pad (2), flags (2), lower (2), upper (2)
P_BRANCH, P_LEAF = 0x01, 0x02
META_DB = 16 + 4 + 4 + 8 + 8     # the meta page's MDB_meta: magic, version, address, mapsize, then dbs[FREE, MAIN]
DB_SIZE = 48                     # MDB_db: pad 4, flags 2, depth 2, branch, leaf, overflow pages, entries, root (8 each)


def _pages(blob: bytes, psize: int, pgno: int) -> tuple[int, list[int]]:
    """(flags, node offsets) of page `pgno`."""
    at = pgno * psize
    _, _, flags, lower, _ = struct.unpack_from("<QHHHH", blob, at)
    count = (lower - PAGE_HEADER) // 2
    return flags, [struct.unpack_from("<H", blob, at + PAGE_HEADER + 2 * i)[0] for i in range(count)]


def live_leaf_holding(data_file: Path, key: bytes, psize: int = 4096) -> tuple[int, list[bytes]]:
    """The page number of the leaf of the main tree (reached from the newest meta page's root) whose nodes hold
    `key` (not an older copy LMDB's copy-on-write left in the file), and the keys of that leaf, in order."""
    blob = Path(data_file).read_bytes()
    metas = []
    for meta in (0, 1):
        main = meta * psize + META_DB + DB_SIZE
        root = struct.unpack_from("<Q", blob, main + 40)[0]
        txnid = struct.unpack_from("<Q", blob, meta * psize + META_DB + 2 * DB_SIZE + 8)[0]
        metas.append((txnid, root))
    pending = [max(metas)[1]]
    while pending:
        pgno = pending.pop()
        flags, nodes = _pages(blob, psize, pgno)
        keys = []
        for offset in nodes:
            at = pgno * psize + offset
            lo, hi, node_flags, ksize = struct.unpack_from("<HHHH", blob, at)
            if flags & P_BRANCH:
                pending.append(lo | hi << 16 | node_flags << 32)
            keys.append(blob[at + 8:at + 8 + ksize])
        if flags & P_LEAF and key in keys:
            return pgno, keys
    raise KeyError(f"{key!r}: in no leaf of {data_file}")


def damage_page(data_file: Path, pgno: int, psize: int = 4096) -> None:
    """Zero page `pgno` in place (its type reads as none: LMDB says MDB_CORRUPTED when a read reaches it)."""
    with open(data_file, "r+b") as f:
        f.seek(pgno * psize)
        f.write(bytes(psize))
        f.flush()
        os.fsync(f.fileno())
