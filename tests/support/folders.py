"""An import-linter contract: no two folders import each other in a circle.

A folder is a package's own modules (its `__init__` and the modules directly in it, not its
subpackages). Folders that import each other, directly or round a longer loop, are one floor in
fact however the code is laid out; a subpackage and its parent count too, so a subpackage may not
import its parent's modules when any of them imports it.
"""

from __future__ import annotations

from collections import defaultdict

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def folder_of(graph: grimp.ImportGraph, module: str) -> str:
    """The folder a module lies in: itself for a package, else its parent package."""
    if graph.find_children(module):
        return module
    return module.rpartition(".")[0] or module


def folder_cycles(graph: grimp.ImportGraph, roots: set[str]) -> list[list[str]]:
    """The strongly connected groups of more than one folder under `roots`, each sorted."""
    edges: dict[str, set[str]] = defaultdict(set)
    for module in graph.modules:
        if module.split(".")[0] not in roots:
            continue
        source = folder_of(graph, module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.split(".")[0] in roots and (target := folder_of(graph, imported)) != source:
                edges[source].add(target)
    # Tarjan's algorithm, iteratively: the graph is small, but recursion depth is not ours to pick
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


class AcyclicFoldersContract(Contract):
    """`type = acyclic_folders`; `roots`: the top-level packages whose folders are checked."""

    type_name = "acyclic_folders"

    roots = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        roots = {str(root) for root in self.roots}  # type: ignore[attr-defined]
        cycles = folder_cycles(graph, roots)
        return ContractCheck(kept=not cycles, metadata={"cycles": cycles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(f"These folders import each other: {', '.join(cycle)}")
            output.new_line()
