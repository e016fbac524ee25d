-- The vectors of the pieces an extractive answer quotes (sentences, list items and table
-- rows, with their heading), computed when a page is indexed so that a turn only encodes
-- its question. Keyed by the page and the digest of the text the encoder saw; `embedder`
-- names the model that made the vector, and only the configured one's are used. Fetched by
-- key, never searched: float16 bytes, not a vector column.
CREATE TABLE piece_vectors (
    page_id   bigint NOT NULL REFERENCES pages(id) ON DELETE CASCADE,
    digest    bytea NOT NULL,
    embedder  text NOT NULL,
    vector    bytea NOT NULL,
    PRIMARY KEY (page_id, digest)
);
-- Nothing to gain from compressing half-precision numbers: keep them as they are.
ALTER TABLE piece_vectors ALTER COLUMN vector SET STORAGE EXTERNAL;
