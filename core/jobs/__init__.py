"""Background jobs: the durable processing of messaging channels."""
