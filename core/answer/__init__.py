"""The answer pipeline: curated answers, query rewrite, prompt, LLM, guard, post-processing."""
