"""No import cycle in ``client/``: each part of the SDK sits above the parts it uses, so a part
can be read, tested and replaced without the ones above it (docs/architecture.md).
import-linter has no cycle contract; grimp, the graph it is built on, finds them here."""

from __future__ import annotations

from pathlib import Path

import grimp

import client


def _client_graph() -> grimp.ImportGraph:
    """The graph of ``client``, with its compiled modules in it: grimp reads Python sources
    only, so ``from client.protocol import _keyfilter`` (C, stubbed by a ``.pyi``) would show
    as an import of the package ``client.streams`` itself, a cycle that is not there."""
    graph = grimp.build_graph("client")
    root = Path(client.__file__).parent
    for stub in root.rglob("*.pyi"):
        if stub.with_suffix(".py").exists():
            continue
        package = ".".join(("client", *stub.parent.relative_to(root).parts))
        compiled = f"{package}.{stub.stem}"
        graph.add_module(compiled)
        for importer in graph.find_modules_that_directly_import(package):
            details = graph.get_import_details(importer=importer, imported=package)
            if all(
                detail["line_contents"].startswith(f"from {package} import {stub.stem}")
                for detail in details
            ):
                graph.remove_import(importer=importer, imported=package)
                graph.add_import(importer=importer, imported=compiled)
    return graph


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return components


def test_no_module_of_the_client_imports_itself_through_others() -> None:
    graph = _client_graph()
    cycles = _cycles(graph)
    chains = [graph.find_shortest_chain(cycle[0], cycle[1]) for cycle in cycles]
    assert cycles == [], f"import cycles in client/: {cycles} (e.g. {chains})"
