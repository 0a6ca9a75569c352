"""Which part of the server may import which, read from the source with ast: the packages
of postbox_server form no import cycle, the CLI is the top layer, and its client verbs
call the server through the SDK rather than stubs of their own."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from support import ROOT

SERVER = ROOT / "server" / "postbox_server"
SDK = ROOT / "stubs" / "python" / "postbox_client"

# Cycles that branches of issue 49 under way remove (item 4: metrics counted outside
# Engine; item 2: no dependency between the SQS and SNS shims). Drop a pair once it is gone.
KNOWN_CYCLES = {frozenset({"db", "observability"}), frozenset({"sns", "sqs"})}


def _imports(tree: ast.AST) -> Iterator[str]:
    """Every module a file imports, at any depth, except for type checking only."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (name for child in node.orelse for name in _imports(child))
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            # `from postbox_server import versions` imports a module by its name.
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        yield from _imports(node)


def _imported_by(path: Path) -> set[str]:
    return set(_imports(ast.parse(path.read_text(), str(path))))


def _part(path: Path) -> str:
    """A file's part of the server: its top-level package, or its module."""
    return path.relative_to(SERVER).parts[0].removesuffix(".py")


def _graph() -> dict[str, set[str]]:
    """Which parts of postbox_server import which others."""
    graph: dict[str, set[str]] = {}
    for path in SERVER.rglob("*.py"):
        part = _part(path)
        edges = graph.setdefault(part, set())
        for name in _imported_by(path):
            pieces = name.split(".")
            other = pieces[1] if pieces[0] == "postbox_server" and len(pieces) > 1 else part
            if other != part and ((SERVER / other).is_dir() or (SERVER / f"{other}.py").exists()):
                edges.add(other)
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return False


def test_the_server_packages_import_each_other_without_a_cycle():
    graph = _graph()
    cycles = {
        frozenset({part, other})
        for part, edges in graph.items()
        for other in edges
        if _reaches(graph, other, part)
    }
    # A cycle of more than two parts shows as the pairs along it.
    assert {tuple(sorted(pair)) for pair in cycles - KNOWN_CYCLES} == set()


def test_auth_and_services_do_not_import_each_other_both_ways():
    """The rules of keys (auth) sit below the servicers that use them (services)."""
    graph = _graph()
    assert "services" not in graph["auth"]
    assert not _reaches(graph, "auth", "services")


def test_only_the_entry_points_import_the_cli():
    graph = _graph()
    assert {part for part, edges in graph.items() if "cli" in edges} == {"__main__"}


def test_client_verbs_call_the_sdk_not_stubs_of_their_own():
    assert (SERVER / "cli").is_dir()
    for path in (SERVER / "cli").rglob("*.py"):
        stubs = {name for name in _imported_by(path) if name.endswith("_pb2_grpc")}
        assert stubs == set(), f"{path.name} imports {sorted(stubs)}: call postbox_client"
        assert "grpc" not in _imported_by(path), f"{path.name}: call postbox_client"


def test_the_sdk_imports_nothing_of_the_server():
    for path in SDK.rglob("*.py"):
        server = {name for name in _imported_by(path) if name.startswith("postbox_server")}
        assert server == set(), path
