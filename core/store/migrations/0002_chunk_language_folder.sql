-- The language folder of a chunk's page URL (/en/, /de-de/ -> "en", "de"), NULL when the
-- URL has none: the language-folder rule filters on it in the same SQL as the vector search.
ALTER TABLE chunks ADD COLUMN folder_language text;
CREATE INDEX chunks_agent_folder_idx ON chunks (agent_id, folder_language);

-- "Does this agent have any page in language X" is asked per question.
CREATE INDEX pages_agent_language_idx ON pages (agent_id, (split_part(locale, '-', 1)));
