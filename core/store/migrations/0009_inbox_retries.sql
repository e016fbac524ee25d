-- A turn that failed on a service that was down waits before it is tried again (back-off);
-- a row staff take up again counts its time limit from then; and the customer is told to
-- hold on at most once per waiting turn.
ALTER TABLE inbox
    ADD COLUMN next_attempt_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN requeued_at     timestamptz,
    ADD COLUMN holding_sent_at timestamptz;

-- Open messages nobody has been told to hold on for yet: what the holding check looks at.
CREATE INDEX inbox_unheld_idx ON inbox (received_at)
    WHERE status IN ('pending', 'processing') AND holding_sent_at IS NULL;
-- Failed messages, for staff and `parley inbox retry`.
CREATE INDEX inbox_failed_idx ON inbox (received_at) WHERE status = 'failed';
