-- Privacy requests: a customer's data erased (or exported) on request, and the audit of it.

-- The key of the audit's customer hashes, one per installation, made here at random and
-- never shown: a hash in the audit cannot be matched to a phone number by guessing numbers
-- without it, yet a repeated request by the same customer is recognisable.
CREATE TABLE privacy_key (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    key       bytea NOT NULL DEFAULT decode(
                  replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex')
);
INSERT INTO privacy_key DEFAULT VALUES;

-- Who erased or exported whose data, and how much was removed: never the customer's id,
-- name or words. Kept when the agent goes, so the record outlives what it is about.
CREATE TABLE privacy_audit (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action        text NOT NULL CHECK (action IN ('erase', 'export')),
    staff         text NOT NULL,       -- the staff account's address, "admin" (token) or "cli:USER"
    agent         text NOT NULL,       -- the agent's slug
    channel       text NOT NULL,
    customer_hash text NOT NULL,       -- HMAC-SHA256 of channel and customer id under privacy_key
    counts        jsonb NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX privacy_audit_agent_idx ON privacy_audit (agent, created_at DESC);
