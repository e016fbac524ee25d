-- What the sender knows of a part's attempts. attempt_started_at: when the latest attempt was
-- claimed. unconfirmed_since: set while an earlier attempt may have been accepted by the
-- provider without its answer reaching us (a timeout after the request went out, a sender
-- that died mid-send); it is when the earliest such attempt began, so that a look-up at the
-- provider can be limited to messages from then on. lookups: look-ups that failed in a row.
ALTER TABLE outbox
    ADD COLUMN attempt_started_at timestamptz,
    ADD COLUMN unconfirmed_since  timestamptz,
    ADD COLUMN lookups            integer NOT NULL DEFAULT 0;
