-- Staff are told when a customer asks for a person or waits too long. Each such event is a
-- row, written in the transaction that made it (a trigger on the status change), so none is
-- lost between the change and its webhook; the row also holds the webhook delivery's state,
-- and each attempt is kept in notification_attempts.
CREATE TABLE notifications (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    type             text NOT NULL CHECK (type IN ('handoff.requested', 'conversation.waiting')),
    conversation_id  bigint NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    waiting_since    timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- pending: to be sent; skipped: no webhook was configured when it was due.
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivered', 'failed', 'skipped')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_status_code integer,
    last_error       text,
    delivered_at     timestamptz,
    -- One event per wait: a conversation that waits again later is told again.
    UNIQUE (conversation_id, type, waiting_since)
);
CREATE INDEX notifications_due_idx ON notifications (next_attempt_at) WHERE status = 'pending';
CREATE INDEX notifications_recent_idx ON notifications (created_at DESC);

CREATE TABLE notification_attempts (
    notification_id bigint NOT NULL REFERENCES notifications(id) ON DELETE CASCADE,
    attempt         integer NOT NULL,
    status_code     integer,
    error           text,
    at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (notification_id, attempt)
);

CREATE FUNCTION notifications_handoff_requested() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'waiting_for_staff' AND OLD.status IS DISTINCT FROM 'waiting_for_staff' THEN
        INSERT INTO notifications (type, conversation_id, waiting_since)
        VALUES ('handoff.requested', NEW.id, coalesce(NEW.status_changed_at, now()))
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER conversations_handoff_requested AFTER UPDATE OF status ON conversations
    FOR EACH ROW EXECUTE FUNCTION notifications_handoff_requested();

-- Announced on the conversations' feed (core/store/handoff.py FEED_CHANNEL), so open consoles
-- hear of it when it commits, in whichever process it was written.
CREATE FUNCTION notifications_announce() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('parley_conversations', json_build_object(
        'conversation_id', c.id, 'agent_id', c.agent_id, 'channel', c.channel,
        'key', c.conversation_key, 'message_id', NULL, 'kind', 'notification')::text)
       FROM conversations c WHERE c.id = NEW.conversation_id;
    RETURN NEW;
END $$;
CREATE TRIGGER notifications_announce AFTER INSERT ON notifications
    FOR EACH ROW EXECUTE FUNCTION notifications_announce();
