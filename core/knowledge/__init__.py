"""Knowledge: sources, crawling, extraction, chunking and indexing of an agent's content."""
