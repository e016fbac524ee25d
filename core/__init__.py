"""Everything in Parley that is not transport: answers, retrieval, knowledge, memory, storage."""
