-- Human handoff: who holds a conversation, and who wrote each staff message.

-- The staff member a conversation is with while its status is 'staff'.
ALTER TABLE conversations ADD COLUMN assigned_to text;
ALTER TABLE conversations ADD COLUMN status_changed_at timestamptz;

-- Staff messages: who wrote them. System messages of a handoff: who changed the status (their
-- text is the new status: 'staff', 'bot' or 'waiting_for_staff').
ALTER TABLE messages ADD COLUMN author text;

-- "Waiting for staff" and "with staff" are few among many; staff look for them first.
CREATE INDEX conversations_handoff_idx ON conversations (agent_id, last_message_at DESC)
    WHERE status <> 'bot';
