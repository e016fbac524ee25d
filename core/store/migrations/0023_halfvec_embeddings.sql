-- Chunk vectors in half precision (pgvector's halfvec). A 512-dimension vector takes 1 KB
-- instead of 2 KB, so each agent's HNSW index is half the size and more of it stays in
-- memory; HNSW takes vectors of up to 4,000 dimensions this way (2,000 as single precision),
-- which OpenAI's text-embedding-3-large (3,072) needs. Rankings do not move: on
-- bench/retrieval.py's 100,000 chunks the exact 50 nearest of 200 questions are the same in
-- half and in single precision.
--
-- The column stays without a fixed size, so agents on different embedders still share the
-- table; each agent's partial index is rebuilt on (embedding::halfvec(N)) for its own N.
-- The old indexes go first: left in place, ALTER TYPE would rebuild them as they were.

CREATE TEMPORARY TABLE parley_0023_indexes ON COMMIT DROP AS
SELECT a.id AS agent_id, a.embedding_dim AS dim
  FROM agents a
 WHERE a.embedding_dim IS NOT NULL
   AND to_regclass(format('chunks_embedding_agent_%s', a.id)) IS NOT NULL;

DO $$
DECLARE
    agent record;
BEGIN
    FOR agent IN SELECT agent_id FROM parley_0023_indexes LOOP
        EXECUTE format('DROP INDEX chunks_embedding_agent_%s', agent.agent_id);
    END LOOP;
END
$$;

ALTER TABLE chunks ALTER COLUMN embedding TYPE halfvec USING embedding::halfvec;

-- Built as core/store/vector_index.py's bind_embedder builds them (same m and
-- ef_construction). The graph of up to about 450,000 chunks of 512 dimensions fits in this
-- memory; a larger agent's build goes on on disk, slower. A server set higher keeps its own.
SELECT set_config('maintenance_work_mem', '1GB', true)
 WHERE (SELECT setting::bigint FROM pg_settings WHERE name = 'maintenance_work_mem') < 1024 * 1024;

DO $$
DECLARE
    agent record;
BEGIN
    FOR agent IN SELECT agent_id, dim FROM parley_0023_indexes ORDER BY agent_id LOOP
        EXECUTE format(
            'CREATE INDEX chunks_embedding_agent_%1$s ON chunks '
            'USING hnsw ((embedding::halfvec(%2$s)) halfvec_cosine_ops) '
            'WITH (m = 16, ef_construction = 64) WHERE agent_id = %1$s',
            agent.agent_id, agent.dim);
    END LOOP;
END
$$;
