"""The commands about retrieval itself rather than serving: the model prepared and trained, its
quality measured (`eval`, `bands`, the FastMCP peer's row), and the corpus and scoring they share."""
