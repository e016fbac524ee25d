-- "Did this answer your question?", asked of a messaging customer once staff resolved their
-- conversation: the latest such prompt of each conversation, about one answer (turn). While it
-- is open and recent, the customer's next message may be their rating ("1" / "2"); whatever
-- they send next closes it. A closed prompt is kept, so one answer is never asked about twice.
CREATE TABLE feedback_prompts (
    conversation_id  bigint PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
    turn_id          bigint NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
    -- text: the customer replies in words; buttons: they press one (Telegram).
    answer_by        text NOT NULL CHECK (answer_by IN ('text', 'buttons')),
    asked_at         timestamptz NOT NULL DEFAULT now(),
    closed_at        timestamptz
);

-- The buttons sent under a part (the prompt's, on Telegram): [{"label", "data"}].
ALTER TABLE outbox ADD COLUMN choices jsonb;
