-- A message's delivery (queued, sent, delivered, read, failed) is read from its outbox parts,
-- which the sender and the providers' status reports keep up to date; the columns on
-- messages that were meant to mirror it were never written, and go.
ALTER TABLE messages DROP COLUMN delivery_status, DROP COLUMN error_code;
CREATE INDEX outbox_message_idx ON outbox (message_id) WHERE message_id IS NOT NULL;
