"""Authorization: who may find and call which tool, decided by Cedar policies in ToolHive's vocabulary.

The policy file checked and compiled (`policies.load_policy`), and the two questions asked of it,
through `authorizer.Authorizer`: which items of a catalog a principal may see (`visibility`), and
whether one call may run (`decide`). docs/authorization.md describes the vocabulary and the file.
"""
