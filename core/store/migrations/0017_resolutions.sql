-- Resolutions: each time staff resolved a conversation, when and by whom, so the reports count
-- resolving itself. A conversation resolved, reopened and resolved again has a row for each.

CREATE TABLE conversation_resolutions (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id bigint NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    staff           text NOT NULL,       -- the staff account's address, or "admin" (token)
    resolved_at     timestamptz NOT NULL DEFAULT now()
);
-- The reports read a period; erasing a customer (cascade) reads by conversation.
CREATE INDEX conversation_resolutions_resolved_at_idx ON conversation_resolutions (resolved_at);
CREATE INDEX conversation_resolutions_conversation_idx
    ON conversation_resolutions (conversation_id, resolved_at);
