-- Staff accounts and their browser sessions, and what the staff console and admin API keep.

CREATE TABLE staff (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- stored lowercased, so one address is one account whatever the capitals typed
    email            text NOT NULL UNIQUE CHECK (email = lower(email) AND email LIKE '%_@_%'),
    display_name     text NOT NULL DEFAULT '',
    password_hash    text NOT NULL,            -- argon2id, in the PHC string format
    disabled_at      timestamptz,
    last_sign_in_at  timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- A signed-in browser. The cookie holds a random id; only its SHA-256 is kept here, so a
-- copy of this table signs nobody in. staff_id is NULL for a sign-in with the admin token;
-- token_mac (HMAC of the session id keyed with that token) then ends the session as soon as
-- the token is changed or removed.
CREATE TABLE staff_sessions (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token_hash   bytea NOT NULL UNIQUE,
    staff_id     bigint REFERENCES staff(id) ON DELETE CASCADE,
    token_mac    bytea,
    csrf_token   text NOT NULL,                 -- the synchronizer token forms must carry
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    CHECK ((staff_id IS NULL) = (token_mac IS NOT NULL))
);
CREATE INDEX staff_sessions_expiry_idx ON staff_sessions (expires_at);

-- A source of pasted text has no file or URL to read again: its text is kept with it.
ALTER TABLE sources ADD COLUMN content text;

-- Gaps are grouped by question similarity; each question is embedded once, by this embedder.
ALTER TABLE content_gaps ADD COLUMN question_embedding vector;
ALTER TABLE content_gaps ADD COLUMN question_embedder text;

-- The conversation list: every agent, newest first.
CREATE INDEX conversations_last_message_idx ON conversations (last_message_at DESC, id DESC);
