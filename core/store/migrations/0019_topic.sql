-- A conversation's topic: one short line on what the customer wants, written once after the
-- first exchange, so the staff list says what a conversation is about long before the rolling
-- summary exists. A column of the conversation, so erasing the conversation erases it; a
-- memory clear leaves it (it names the conversation, not what the bot remembers).
ALTER TABLE conversations ADD COLUMN topic text;
