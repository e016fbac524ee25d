"""Language models: the OpenAI-compatible streaming client and the extractive answerer."""
