"""The answer pipeline: curated answers, query rewrite, prompt, LLM stream, guard, post-processing."""
