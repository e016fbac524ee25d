-- Channels come from the gateway's registry: a conversation's channel is a name checked
-- there, not a list fixed in SQL. Each inbox row keeps the message as its channel
-- normalised it (core/inbound.py) beside the provider's payload, which stays for staff.
ALTER TABLE conversations DROP CONSTRAINT IF EXISTS conversations_channel_check;
ALTER TABLE conversations ADD CONSTRAINT conversations_channel_name
    CHECK (channel ~ '^[a-z][a-z0-9_]{0,31}$');

ALTER TABLE inbox ADD COLUMN message jsonb;
UPDATE inbox SET message = jsonb_build_object(
    'customer_id', conversation_key,
    'provider_message_id', provider_message_id,
    'text', CASE channel
        WHEN 'telegram' THEN btrim(coalesce(payload #>> '{message,text}',
                                            payload #>> '{message,caption}', ''))
        ELSE btrim(coalesce(payload ->> 'Body', ''))
    END,
    'display_name', CASE channel
        WHEN 'telegram' THEN nullif(btrim(concat_ws(' ', payload #>> '{message,from,first_name}',
                                                    payload #>> '{message,from,last_name}')), '')
        ELSE nullif(payload ->> 'ProfileName', '')
    END,
    'handle', CASE channel WHEN 'telegram' THEN payload #>> '{message,from,username}' END,
    'language_hint', CASE channel WHEN 'telegram' THEN payload #>> '{message,from,language_code}' END,
    'command', CASE WHEN channel = 'telegram'
                     AND (payload #>> '{message,text}') ~ '^/start(@\S+)?(\s|$)' THEN 'start' END,
    'media', CASE WHEN (payload ->> 'media_only')::boolean
                  THEN jsonb_build_array(jsonb_build_object('kind', 'other', 'ref', ''))
                  ELSE '[]'::jsonb END
);
ALTER TABLE inbox ALTER COLUMN message SET NOT NULL;
ALTER TABLE conversations ADD COLUMN customer_handle text;  -- a username (Telegram), shown when there is no name
ALTER TABLE outbox ADD COLUMN template jsonb;  -- an approved template sent instead of the body (WhatsApp)
