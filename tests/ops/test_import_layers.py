"""Which part of the server may import which, read from the source with ast: the packages
of postbox_server form no import cycle, the CLI is the top layer, and its client verbs
and the MCP server (mcp_server/) call the server through the SDK rather than stubs of
their own; db/, the seam to
PostgreSQL, imports nothing above it (the engine tells an EngineObserver what happened,
and observability subscribes from above); postbox_client's modules import one another at
runtime without a cycle (a module that needs another only for its types imports it under
`if TYPE_CHECKING:`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from support import ROOT

SERVER = ROOT / "server" / "postbox_server"
SDK = ROOT / "stubs" / "python" / "postbox_client"

# No cycle is known; a pair here would be one left on purpose, with its reason.
KNOWN_CYCLES: set[frozenset[str]] = set()


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
    """The CLI's client verbs, and the MCP server's tools, which act with the caller's key
    through the API every client uses."""
    assert (SERVER / "cli").is_dir()
    assert (SERVER / "mcp_server").is_dir()
    for path in [*(SERVER / "cli").rglob("*.py"), *(SERVER / "mcp_server").rglob("*.py")]:
        stubs = {name for name in _imported_by(path) if name.endswith("_pb2_grpc")}
        assert stubs == set(), f"{path.name} imports {sorted(stubs)}: call postbox_client"
        assert "grpc" not in _imported_by(path), f"{path.name}: call postbox_client"


def test_the_mcp_server_reaches_postbox_only_through_the_sdk():
    """Nothing of the server's own engine, services or database: only the SDK client, the
    documents the CLI prints too (proto_json), and the MCP SDK."""
    graph = _graph()
    assert graph["mcp_server"] <= {"proto_json"}, graph["mcp_server"]


def test_the_sdk_imports_nothing_of_the_server():
    for path in SDK.rglob("*.py"):
        server = {name for name in _imported_by(path) if name.startswith("postbox_server")}
        assert server == set(), path


def _module_name(path: Path, package_root: Path) -> str:
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name an ImportFrom names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _resolved_imports(path: Path, package_root: Path, *, runtime_only: bool) -> Iterator[str]:
    """Every module `path` imports (with `from a import b`, both a and a.b); with
    runtime_only, not those under `if TYPE_CHECKING:`."""
    module = _module_name(path, package_root)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))

    def visit(node: ast.AST) -> Iterator[str]:
        if runtime_only and isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from visit(child)
            return
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, module, is_package)
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            yield from visit(child)

    yield from visit(tree)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


# What stands on db/: nothing of db/ imports these, not even for its types.
ABOVE_DB = tuple(
    f"postbox_server.{name}"
    for name in (
        "observability", "services", "workers", "http", "console", "auth", "aws", "app",
        "cli", "processes",
    )
)  # fmt: skip


def test_db_imports_nothing_above_it() -> None:
    """Above all neither observability/ nor services/, which once tied the engine in a cycle."""
    found = []
    for path in sorted((SERVER / "db").rglob("*.py")):
        for name in _resolved_imports(path, SERVER, runtime_only=False):
            for above in ABOVE_DB:
                if _within(name, above):
                    found.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not found, "db/ reaches above itself:\n" + "\n".join(sorted(set(found)))


def _client_graph() -> dict[str, set[str]]:
    modules = {_module_name(path, SDK): path for path in sorted(SDK.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        graph[module] = {
            name
            for name in _resolved_imports(path, SDK, runtime_only=True)
            if name in modules and name != module
        }
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := walk(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)) is not None:
            return found
    return None


def test_the_sdks_modules_import_one_another_without_a_cycle() -> None:
    graph = _client_graph()
    assert "postbox_client.client" in graph  # the walk found the package
    cycle = _cycle(graph)
    assert cycle is None, "a runtime import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a graph with a cycle is reported."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
