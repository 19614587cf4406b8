"""Retrieval.

Tools and their documents, the embedding cache, index versions, the hybrid search and tool names.
"""
