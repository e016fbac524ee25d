-- Staff roles: an admin may do everything; an agent works on conversations, content gaps,
-- curated answers, answer checks and the playground, and changes no settings, sources or
-- accounts. Every account that exists now could do everything, so it becomes an admin;
-- accounts made from now on are agents unless said otherwise.

ALTER TABLE staff
    ADD COLUMN role text NOT NULL DEFAULT 'admin' CHECK (role IN ('admin', 'agent'));
ALTER TABLE staff ALTER COLUMN role SET DEFAULT 'agent';
