-- The system of record: agents and their knowledge, conversations, the durable
-- inbox/outbox of the messaging channels, and what staff read afterwards.

CREATE EXTENSION IF NOT EXISTS vector;

-- Full-text configuration for a page locale ('nl', 'de-de', ...); 'simple' when unknown.
CREATE FUNCTION parley_ts_config(locale text) RETURNS regconfig
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE split_part(lower(coalesce(locale, '')), '-', 1)
    WHEN 'en' THEN 'english'::regconfig   WHEN 'nl' THEN 'dutch'::regconfig
    WHEN 'de' THEN 'german'::regconfig    WHEN 'fr' THEN 'french'::regconfig
    WHEN 'es' THEN 'spanish'::regconfig   WHEN 'it' THEN 'italian'::regconfig
    WHEN 'pt' THEN 'portuguese'::regconfig WHEN 'sv' THEN 'swedish'::regconfig
    WHEN 'da' THEN 'danish'::regconfig    WHEN 'no' THEN 'norwegian'::regconfig
    WHEN 'nb' THEN 'norwegian'::regconfig WHEN 'fi' THEN 'finnish'::regconfig
    ELSE 'simple'::regconfig
  END
$$;

CREATE TABLE agents (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    slug                 text NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    name                 text NOT NULL,
    default_language     text NOT NULL DEFAULT 'en',
    timezone             text NOT NULL DEFAULT 'UTC',
    persona              text NOT NULL DEFAULT '',
    custom_prompt        text NOT NULL DEFAULT '',
    confidence_threshold real NOT NULL DEFAULT 0.35
                         CHECK (confidence_threshold >= 0 AND confidence_threshold <= 1),
    contact_route        text NOT NULL DEFAULT '',
    widget_key           text NOT NULL UNIQUE,
    allowed_origins      text[] NOT NULL DEFAULT '{}',
    -- channel credentials, business hours, welcome / handoff texts
    settings             jsonb NOT NULL DEFAULT '{}',
    -- the embedder this agent's vectors come from; its HNSW index is built for this size
    embedder             text,
    embedding_dim        integer CHECK (embedding_dim > 0),
    -- bumped on every knowledge change; part of every retrieval cache key
    knowledge_version    bigint NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id     bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    name         text NOT NULL DEFAULT '',
    prefix       text NOT NULL,           -- shown to staff to tell keys apart
    key_hash     bytea NOT NULL UNIQUE,   -- sha256 of the full key; the key itself is never stored
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);

CREATE TABLE sources (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id        bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    kind            text NOT NULL CHECK (kind IN ('directory', 'file', 'jsonl', 'url', 'sitemap', 'text')),
    location        text NOT NULL,
    status          text NOT NULL DEFAULT 'new' CHECK (status IN ('new', 'indexing', 'ready', 'failed')),
    last_crawled_at timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (agent_id, kind, location)
);

CREATE TABLE pages (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id      bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    source_id     bigint NOT NULL REFERENCES sources(id) ON DELETE CASCADE,
    url           text NOT NULL,
    title         text NOT NULL DEFAULT '',
    locale        text,
    visibility    text NOT NULL DEFAULT 'public' CHECK (visibility IN ('public', 'internal')),
    tags          text[] NOT NULL DEFAULT '{}',
    page_type     text NOT NULL DEFAULT 'page',
    product       jsonb,                   -- JSON-LD product facts: name, price, availability
    content_hash  bytea NOT NULL,
    etag          text,
    last_modified text,
    fetched_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (agent_id, url)
);
CREATE INDEX pages_source_idx ON pages (source_id);

CREATE TABLE chunks (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id     bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    page_id      bigint NOT NULL REFERENCES pages(id) ON DELETE CASCADE,
    ord          integer NOT NULL,
    heading      text NOT NULL DEFAULT '',  -- heading path, "Returns > Exchanges"
    text         text NOT NULL,
    -- copied from the page so that filters need no join on the hot path
    locale       text,
    visibility   text NOT NULL DEFAULT 'public' CHECK (visibility IN ('public', 'internal')),
    tags         text[] NOT NULL DEFAULT '{}',
    page_type    text NOT NULL DEFAULT 'page',
    -- dimension-free column: each agent gets a partial HNSW index on
    -- (embedding::vector(N)) for its own embedder (see core/store/vector_index.py)
    embedding    vector NOT NULL,
    tsv          tsvector GENERATED ALWAYS AS (
                     setweight(to_tsvector(parley_ts_config(locale), heading), 'A') ||
                     setweight(to_tsvector(parley_ts_config(locale), text), 'B')
                 ) STORED,
    UNIQUE (page_id, ord)
);
CREATE INDEX chunks_agent_idx ON chunks (agent_id);
CREATE INDEX chunks_tsv_idx ON chunks USING gin (tsv);
CREATE INDEX chunks_tags_idx ON chunks USING gin (tags);

CREATE TABLE conversations (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id         bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    channel          text NOT NULL CHECK (channel IN ('web', 'api', 'whatsapp', 'telegram', 'playground', 'test')),
    conversation_key text NOT NULL,       -- the channel's own id: session id, whatsapp:+31..., chat id
    customer_name    text,
    language         text,
    status           text NOT NULL DEFAULT 'bot' CHECK (status IN ('bot', 'waiting_for_staff', 'staff')),
    generation       integer NOT NULL DEFAULT 0,   -- bumped by "clear conversation"
    last_message_at  timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (agent_id, channel, conversation_key)
);
CREATE INDEX conversations_recent_idx ON conversations (agent_id, last_message_at DESC);

CREATE TABLE turns (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id  bigint NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    agent_id         bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    channel          text NOT NULL,
    query            text NOT NULL,
    rewritten_query  text,
    confidence       real,
    low_confidence   boolean NOT NULL DEFAULT false,
    mode             text NOT NULL DEFAULT 'llm',      -- llm, extractive, curated, staff
    trace            jsonb NOT NULL DEFAULT '{}',      -- retrieved chunks and scores, timings, model, tokens
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX turns_conversation_idx ON turns (conversation_id, id);

CREATE TABLE messages (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id     bigint NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role                text NOT NULL CHECK (role IN ('visitor', 'assistant', 'staff', 'system')),
    text                text NOT NULL,
    turn_id             bigint REFERENCES turns(id) ON DELETE SET NULL,
    generation          integer NOT NULL DEFAULT 0,
    provider_message_id text,
    delivery_status     text,
    error_code          text,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX messages_conversation_idx ON messages (conversation_id, id);

CREATE TABLE summaries (
    conversation_id  bigint PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
    text             text NOT NULL,
    through_message  bigint NOT NULL,      -- last message id the summary covers
    generation       integer NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE content_gaps (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id     bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    turn_id      bigint REFERENCES turns(id) ON DELETE SET NULL,
    question     text NOT NULL,
    language     text,
    reason       text NOT NULL CHECK (reason IN ('weak_match', 'deferred')),
    confidence   real,
    resolved_at  timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX content_gaps_open_idx ON content_gaps (agent_id, created_at DESC) WHERE resolved_at IS NULL;

CREATE TABLE curated_answers (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id    bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    question    text NOT NULL DEFAULT '',   -- matched by embedding similarity when set
    keywords    text[] NOT NULL DEFAULT '{}',
    pattern     text,                       -- a regular expression
    answer      text NOT NULL,
    language    text,
    enabled     boolean NOT NULL DEFAULT true,
    hit_count   bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Webhook deliveries, written before the provider gets its 200; a re-delivery is a no-op.
CREATE TABLE inbox (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id            bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    channel             text NOT NULL,
    provider_message_id text NOT NULL,     -- Twilio MessageSid, Telegram update_id
    conversation_key    text NOT NULL,
    payload             jsonb NOT NULL,
    status              text NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'processing', 'done', 'ignored', 'failed')),
    attempts            integer NOT NULL DEFAULT 0,
    lease_until         timestamptz,
    error               text,
    received_at         timestamptz NOT NULL DEFAULT now(),
    processed_at        timestamptz,
    UNIQUE (agent_id, channel, provider_message_id)
);
CREATE INDEX inbox_pending_idx ON inbox (received_at) WHERE status IN ('pending', 'processing');

CREATE TABLE outbox (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id            bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    channel             text NOT NULL,
    conversation_id     bigint REFERENCES conversations(id) ON DELETE CASCADE,
    message_id          bigint REFERENCES messages(id) ON DELETE SET NULL,
    recipient           text NOT NULL,
    part                integer NOT NULL DEFAULT 0,   -- order of the parts of a split reply
    body                text NOT NULL,
    status              text NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'sending', 'sent', 'delivered', 'read', 'failed', 'undelivered')),
    attempts            integer NOT NULL DEFAULT 0,
    next_attempt_at     timestamptz NOT NULL DEFAULT now(),
    lease_until         timestamptz,
    provider_message_id text,
    error_code          text,
    error_message       text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    sent_at             timestamptz
);
CREATE INDEX outbox_due_idx ON outbox (next_attempt_at) WHERE status IN ('pending', 'sending');
CREATE UNIQUE INDEX outbox_provider_idx ON outbox (channel, provider_message_id)
    WHERE provider_message_id IS NOT NULL;

CREATE TABLE usage (
    agent_id          bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    day               date NOT NULL,
    channel           text NOT NULL,
    turns             integer NOT NULL DEFAULT 0,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (agent_id, day, channel)
);
