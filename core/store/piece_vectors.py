"""The stored vectors of the pieces an extractive answer quotes, kept per page and text.

A piece's vector is stored under its page and the digest of the text the encoder saw, with
the name of the embedder that made it: a vector is only ever used for the very same text,
from the embedder in use, so a stored one is the one a turn would compute. They are only
fetched by key, never searched, so they are kept as float16 bytes (half a `vector` column's
size) and need no pgvector type.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
import numpy as np
from numpy.typing import NDArray

from core.store.database import Connection

log = logging.getLogger(__name__)

# Little-endian half precision: similarities off by about 1e-4, far below what tells two
# pieces apart.
STORED = np.dtype("<f2")

Key = tuple[int, bytes]  # (page id, digest of the piece's text)


def to_bytes(vectors: NDArray[np.float32]) -> list[bytes]:
    """Each row as stored."""
    packed = np.ascontiguousarray(vectors, dtype=STORED)
    return [row.tobytes() for row in packed]


def from_bytes(blobs: Sequence[bytes], dimension: int) -> NDArray[np.float32]:
    """Stored rows back as one float32 matrix of ``dimension`` columns."""
    if not blobs:
        return np.zeros((0, dimension), dtype=np.float32)
    matrix = np.frombuffer(b"".join(blobs), dtype=STORED).reshape(len(blobs), dimension)
    return matrix.astype(np.float32)


@dataclass(frozen=True, slots=True)
class PagePieces:
    """The vectors of one page's pieces as ingest made them: digests and stored rows."""

    embedder: str
    digests: Sequence[bytes]
    vectors: Sequence[bytes]


async def write_pieces(conn: Connection, page_id: int, pieces: PagePieces | None) -> None:
    """Replace a page's piece vectors (inside the transaction that replaces its chunks);
    None leaves it none, to be computed by the first turn that quotes the page."""
    await conn.execute("DELETE FROM piece_vectors WHERE page_id = $1", page_id)
    if pieces is None or not pieces.digests:
        return
    await conn.copy_records_to_table(
        "piece_vectors",
        columns=["page_id", "digest", "embedder", "vector"],
        records=[
            (page_id, key, pieces.embedder, vector)
            for key, vector in zip(pieces.digests, pieces.vectors, strict=True)
        ],
    )


class PieceVectors:
    """Lookups by (page, digest) for a turn, and the vectors a turn had to compute itself
    (content indexed before pieces were, texts only a turn puts together), kept for the next.
    Neither ever fails a turn: without the database the turn computes what it needs."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def fetch(
        self, embedder: str, dimension: int, keys: Sequence[Key]
    ) -> dict[Key, NDArray[np.float32]]:
        """The stored vectors of ``keys`` made by ``embedder``; missing keys are left out."""
        if not keys:
            return {}
        try:
            rows = await self._pool.fetch(
                """SELECT v.page_id, v.digest, v.vector
                     FROM unnest($1::bigint[], $2::bytea[]) AS k(page_id, digest)
                     JOIN piece_vectors v ON v.page_id = k.page_id AND v.digest = k.digest
                    WHERE v.embedder = $3""",
                [page for page, _ in keys],
                [key for _, key in keys],
                embedder,
            )
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            log.warning("pieces.fetch.failed reason=%s", type(exc).__name__)
            return {}
        size = dimension * STORED.itemsize
        rows = [r for r in rows if len(r["vector"]) == size]
        matrix = from_bytes([r["vector"] for r in rows], dimension)
        return {(r["page_id"], r["digest"]): matrix[i] for i, r in enumerate(rows)}

    async def keep(self, embedder: str, keys: Sequence[Key], vectors: NDArray[np.float32]) -> None:
        """Store vectors a turn computed; pages removed meanwhile take none."""
        if not keys:
            return
        # Each key once (a statement may not touch a row twice), in one order for every
        # writer, so that two turns storing the same pieces never wait on each other in a
        # circle.
        order = sorted({key: i for i, key in enumerate(keys)}.values(), key=lambda i: keys[i])
        blobs = to_bytes(vectors)
        try:
            await self._pool.execute(
                """INSERT INTO piece_vectors (page_id, digest, embedder, vector)
                   SELECT k.page_id, k.digest, $3, k.vector
                     FROM unnest($1::bigint[], $2::bytea[], $4::bytea[])
                          WITH ORDINALITY AS k(page_id, digest, vector, n)
                    WHERE EXISTS (SELECT 1 FROM pages p WHERE p.id = k.page_id)
                    ORDER BY k.n
                   ON CONFLICT (page_id, digest) DO UPDATE
                      SET embedder = EXCLUDED.embedder, vector = EXCLUDED.vector
                    WHERE piece_vectors.embedder <> EXCLUDED.embedder""",
                [keys[i][0] for i in order],
                [keys[i][1] for i in order],
                embedder,
                [blobs[i] for i in order],
            )
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            log.warning("pieces.keep.failed reason=%s", type(exc).__name__)
