-- Telegram message ids are unique per chat only, so a provider id is unique per recipient.
DROP INDEX outbox_provider_idx;
CREATE UNIQUE INDEX outbox_provider_idx ON outbox (channel, recipient, provider_message_id)
    WHERE provider_message_id IS NOT NULL;
-- Delivery-status callbacks find their row by provider id.
CREATE INDEX outbox_provider_lookup_idx ON outbox (provider_message_id)
    WHERE provider_message_id IS NOT NULL;
