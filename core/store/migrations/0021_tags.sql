-- Tags from three places. A source's own tags (`parley ingest --tag`, the console) go to
-- every page read from it; a page's own tags are those of its .jsonl line (own_tags), or
-- those staff gave it in the console (staff_tags, NULL until they do, kept across re-reads);
-- and the agent's URL rules (settings "tag_rules") tag pages by their path. pages.tags and
-- chunks.tags hold the union, which retrieval filters on.
ALTER TABLE sources ADD COLUMN tags text[] NOT NULL DEFAULT '{}';
ALTER TABLE pages ADD COLUMN own_tags text[] NOT NULL DEFAULT '{}';
ALTER TABLE pages ADD COLUMN staff_tags text[];
UPDATE pages SET own_tags = tags;

-- The path of a page's URL, which the rules match: "/blog/post" for
-- "https://shop.example/blog/post?page=2", and for "/blog/post" (read from a folder).
CREATE FUNCTION parley_url_path(url text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT coalesce(
           nullif(substring(regexp_replace(url, '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*', '')
                            FROM '^[^?#]*'), ''),
           '/')
$$;

-- A rule's glob as an anchored regular expression: * any characters ("/" too), ? one
-- character, everything else as written.
CREATE FUNCTION parley_glob_regex(pattern text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT '^' || replace(replace(regexp_replace(pattern, '([.\[\]{}()\\+^$|])', '\\\1', 'g'),
                                '*', '.*'),
                        '?', '.') || '$'
$$;

-- The tags a page carries: its own, its source's, and the tags of each rule
-- ([{"pattern": "/blog/*", "tags": ["blog"]}]) its URL path matches; sorted, once each.
CREATE FUNCTION parley_page_tags(url text, own text[], source_tags text[], rules jsonb)
RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT coalesce(array_agg(DISTINCT tag ORDER BY tag), '{}')
    FROM (SELECT unnest(own || source_tags) AS tag
          UNION ALL
          SELECT jsonb_array_elements_text(rule -> 'tags')
            FROM jsonb_array_elements(
                   CASE WHEN jsonb_typeof(rules) = 'array' THEN rules ELSE '[]' END) AS rule
           WHERE jsonb_typeof(rule -> 'tags') = 'array'
             AND jsonb_typeof(rule -> 'pattern') = 'string'
             AND parley_url_path(url) ~ parley_glob_regex(rule ->> 'pattern')) AS found
   WHERE tag IS NOT NULL
$$;
