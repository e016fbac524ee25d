"""Retrieval: embedders, hybrid search, fusion, reranking, boosts and filters."""
