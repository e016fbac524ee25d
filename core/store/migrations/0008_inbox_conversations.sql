-- Claiming looks at one conversation's open messages at a time: without this index every claim
-- scanned the whole backlog, so the busier the inbox, the slower each claim.
CREATE INDEX inbox_conversation_open_idx ON inbox (agent_id, channel, conversation_key, received_at)
    WHERE status IN ('pending', 'processing');
