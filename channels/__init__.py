"""Channel adapters: verify and parse inbound messages into turn requests, deliver the replies."""
