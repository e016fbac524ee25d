-- Inbox work: read marks, open/pending/resolved, assignment, labels, internal notes, saved
-- replies, full-text search, and a NOTIFY on every stored message for the live list.

-- Open until staff say pending or resolved; a visitor writing again opens it again.
ALTER TABLE conversations ADD COLUMN inbox_status text NOT NULL DEFAULT 'open'
    CHECK (inbox_status IN ('open', 'pending', 'resolved'));
-- The teammate a conversation is assigned to (NULL: unassigned).
ALTER TABLE conversations ADD COLUMN assignee_id bigint REFERENCES staff(id) ON DELETE SET NULL;
-- When status, assignment or labels last changed: the live list's watermark with last_message_at.
ALTER TABLE conversations ADD COLUMN inbox_changed_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX conversations_assignee_idx ON conversations (assignee_id, last_message_at DESC);

-- When each staff member (account address, or "admin") last opened a conversation.
CREATE TABLE conversation_reads (
    conversation_id bigint NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    reader          text NOT NULL,
    read_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, reader)
);

CREATE TABLE conversation_labels (
    conversation_id bigint NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    label           text NOT NULL CHECK (length(label) BETWEEN 1 AND 50),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, label)
);
CREATE INDEX conversation_labels_label_idx ON conversation_labels (label);

-- Internal notes: kept apart from messages, so neither the bot's memory, the prompt nor the
-- outbox (which read messages only) can ever see them.
CREATE TABLE conversation_notes (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id bigint NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    author          text NOT NULL,
    text            text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX conversation_notes_conversation_idx ON conversation_notes (conversation_id, id);

CREATE TABLE saved_replies (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id    bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    title       text NOT NULL,
    text        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (agent_id, title)
);

-- Search over what was said and who said it, whatever the language: the 'simple' config.
CREATE INDEX messages_text_search_idx ON messages USING gin (to_tsvector('simple', text));
CREATE INDEX conversations_customer_search_idx ON conversations USING gin (
    to_tsvector('simple', coalesce(customer_name, '') || ' ' || coalesce(customer_handle, '')
                          || ' ' || conversation_key));

-- Every stored message is announced on the conversations feed (kind "message"), so the live
-- conversation list hears of bot turns too; a visitor writing reopens a resolved one.
CREATE FUNCTION inbox_work_message_stored() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c conversations%ROWTYPE;
BEGIN
    SELECT * INTO c FROM conversations WHERE id = NEW.conversation_id;
    IF NEW.role = 'visitor' AND c.inbox_status <> 'open' THEN
        UPDATE conversations SET inbox_status = 'open', inbox_changed_at = now()
         WHERE id = NEW.conversation_id;
    END IF;
    PERFORM pg_notify('parley_conversations', json_build_object(
        'conversation_id', c.id, 'agent_id', c.agent_id, 'channel', c.channel,
        'key', c.conversation_key, 'message_id', NEW.id, 'kind', 'message')::text);
    RETURN NULL;
END $$;
CREATE TRIGGER messages_inbox_work AFTER INSERT ON messages
    FOR EACH ROW EXECUTE FUNCTION inbox_work_message_stored();
