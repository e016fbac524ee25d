-- Scheduled jobs: one row per run, so operators see what ran where, and so that processes
-- whose schedulers fire the same slot a few seconds apart run it once between them.
CREATE TABLE job_runs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text NOT NULL,
    trigger      text NOT NULL CHECK (trigger IN ('schedule', 'manual')),
    -- the scheduled time this run is for; NULL for runs started by hand
    slot         timestamptz,
    instance     text NOT NULL,           -- host:pid of the process that ran it
    status       text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'ok', 'failed')),
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    summary      text,
    details      jsonb NOT NULL DEFAULT '{}',
    error        text,
    CHECK ((trigger = 'schedule') = (slot IS NOT NULL))
);
CREATE UNIQUE INDEX job_runs_slot_idx ON job_runs (name, slot) WHERE slot IS NOT NULL;
CREATE INDEX job_runs_name_idx ON job_runs (name, id DESC);

-- Staff's test questions per agent, asked nightly through the answer pipeline.
CREATE TABLE answer_checks (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id        bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    question        text NOT NULL CHECK (btrim(question) <> ''),
    -- each must appear in the answer (case-insensitive)
    expected_facts  text[] NOT NULL DEFAULT '{}',
    -- a page URL the answer must cite
    must_cite       text,
    language        text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CHECK (cardinality(expected_facts) > 0 OR must_cite IS NOT NULL)
);
CREATE INDEX answer_checks_agent_idx ON answer_checks (agent_id, id);

CREATE TABLE answer_check_results (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id         bigint NOT NULL REFERENCES job_runs(id) ON DELETE CASCADE,
    check_id       bigint NOT NULL REFERENCES answer_checks(id) ON DELETE CASCADE,
    agent_id       bigint NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    passed         boolean NOT NULL,
    answer         text NOT NULL,
    missing_facts  text[] NOT NULL DEFAULT '{}',
    cited_urls     text[] NOT NULL DEFAULT '{}',
    cited_ok       boolean,                 -- NULL when the check names no URL
    confidence     real,
    error          text,                    -- the turn failed (e.g. llm_failed)
    turn_id        bigint REFERENCES turns(id) ON DELETE SET NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run_id, check_id)
);
CREATE INDEX answer_check_results_agent_idx ON answer_check_results (agent_id, id DESC);
CREATE INDEX answer_check_results_check_idx ON answer_check_results (check_id, id DESC);
