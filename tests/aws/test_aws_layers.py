"""The AWS layer's boundaries: `aws/sqs` and `aws/sns` never import each other, and what
they share (the modules of `aws/` itself) imports neither; only `aws/app.py`, which
serves both, knows both. Read from the source with ast, so an import inside a function
counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

AWS = Path(__file__).resolve().parents[2] / "server" / "postbox_server" / "aws"
PACKAGE = "postbox_server.aws"


def _module_name(path: Path) -> str:
    parts = path.relative_to(AWS.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, source: str | None = None) -> set[str]:
    """Every module the file imports (its text, or `source`), relative imports resolved."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            # `from postbox_server.aws import sns` imports the package sns.
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _reaches(imports: set[str], package: str) -> list[str]:
    return sorted(i for i in imports if i == package or i.startswith(package + "."))


def _files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


@pytest.mark.parametrize(("service", "other"), [("sqs", "sns"), ("sns", "sqs")], ids=["sqs", "sns"])
def test_a_service_never_imports_the_other(service: str, other: str) -> None:
    files = _files(AWS / service)
    assert files, f"no modules under {AWS / service}"
    crossings = {
        str(path.relative_to(AWS)): found
        for path in files
        if (found := _reaches(_imports(path), f"{PACKAGE}.{other}"))
    }
    assert not crossings, f"aws/{service} imports aws/{other}: {crossings}"


def test_the_shared_layer_imports_neither_service() -> None:
    crossings = {}
    for path in sorted(AWS.glob("*.py")):
        if path.name == "app.py":
            continue  # serves both: it picks the protocol of each request
        imports = _imports(path)
        found = _reaches(imports, f"{PACKAGE}.sqs") + _reaches(imports, f"{PACKAGE}.sns")
        if found:
            crossings[path.name] = found
    assert not crossings, f"aws/ imports a service: {crossings}"


def test_the_walk_sees_an_import_it_must_refuse() -> None:
    # The checker itself: imports inside a function, relative or absolute, are caught.
    source = "def f():\n    from ...sns import protocol\n    from postbox_server.aws import sns\n"
    imports = _imports(AWS / "sqs" / "actions" / "probe.py", source)
    assert _reaches(imports, f"{PACKAGE}.sns") == [
        "postbox_server.aws.sns",
        "postbox_server.aws.sns.protocol",
    ]
