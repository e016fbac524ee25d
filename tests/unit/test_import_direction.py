"""Dependencies point one way: gateway -> channels -> core."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FORBIDDEN = {
    "core": ("aiohttp.web", "channels", "gateway"),
    "channels": ("gateway",),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from aiohttp import web` imports aiohttp.web too
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _violations(package: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, name in _imports(path):
            for forbidden in FORBIDDEN[package]:
                if name == forbidden or name.startswith(forbidden + "."):
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downwards(package: str) -> None:
    assert (ROOT / package / "__init__.py").exists()
    assert _violations(package) == []


def test_the_check_catches_a_violation(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from aiohttp import web\nimport gateway.app\n")
    names = [name for _, name in _imports(sample)]
    assert "aiohttp.web" in names
    assert "gateway.app" in names
