-- An agent's monthly answer quota counts its answered turns since the month began in its
-- time zone (core/store/quotas.py); without this index every turn would read all of them.
CREATE INDEX turns_agent_created_idx ON turns (agent_id, created_at);
