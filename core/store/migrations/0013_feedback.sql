-- A visitor's thumbs up / thumbs down on one answer. One rating per turn: a later
-- one replaces it. A thumbs-down is also a content gap (reason 'thumbs_down'), so staff see
-- it where they already look; taking it back (thumbs up) withdraws that gap while it is open.
CREATE TABLE feedback (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id         bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    conversation_id  bigint NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    turn_id          bigint NOT NULL UNIQUE REFERENCES turns(id) ON DELETE CASCADE,
    channel          text NOT NULL,
    rating           text NOT NULL CHECK (rating IN ('up', 'down')),
    comment          text CHECK (char_length(comment) <= 1000),
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX feedback_agent_idx ON feedback (agent_id, created_at DESC);

ALTER TABLE content_gaps DROP CONSTRAINT IF EXISTS content_gaps_reason_check;
ALTER TABLE content_gaps ADD CONSTRAINT content_gaps_reason_check
    CHECK (reason IN ('weak_match', 'deferred', 'thumbs_down'));
-- One open thumbs-down gap per turn: re-rating "down" again does not add a second.
CREATE UNIQUE INDEX content_gaps_thumbs_down_idx ON content_gaps (turn_id)
    WHERE reason = 'thumbs_down' AND resolved_at IS NULL;
