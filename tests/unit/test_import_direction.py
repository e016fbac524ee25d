"""Dependencies point one way: gateway -> channels -> core, and inside core up its layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FORBIDDEN = {
    "core": ("aiohttp.web", "channels", "gateway"),
    "channels": ("gateway",),
}

# The layers inside core, lowest first. A module may import its own unit (a module, or a
# package with everything in it) and the units of lower layers; units that share a layer
# know nothing of each other.
CORE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("core.errors",),
    ("core.settings",),
    (
        "core.clients",
        "core.deferrals",
        "core.delivery",
        "core.documents",
        "core.fencing",
        "core.inbound",
        "core.keyring",
        "core.locale",
        "core.logcontext",
        "core.patterns",
        "core.ports",
        "core.slots",
        "core.turns",
    ),
    ("core.tags", "core.wrong_secrets"),
    ("core.cache", "core.llm", "core.store"),
    ("core.handoff", "core.knowledge", "core.privacy", "core.transcribe"),
    # media downloads go out through the crawler's guard (core.knowledge.outbound)
    ("core.media", "core.retrieval"),
    ("core.memory",),
    ("core.answer",),
    ("core.feedback",),
    ("core.jobs",),
)
LEVEL = {unit: level for level, layer in enumerate(CORE_LAYERS) for unit in layer}


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


def _unit(module: str) -> str | None:
    return next((u for u in LEVEL if module == u or module.startswith(u + ".")), None)


def _upward_in_core(root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / "core").rglob("*.py")):
        where = path.relative_to(root)
        module = ".".join(where.with_suffix("").parts).removesuffix(".__init__")
        own = _unit(module)
        if own is None:
            if module != "core":
                bad.append(f"{where} is in no layer of CORE_LAYERS")
            continue
        for line, name in _imports(path):
            target = _unit(name)
            if target is not None and target != own and LEVEL[target] >= LEVEL[own]:
                bad.append(f"{where}:{line} ({own}) imports {name} ({target}), not below it")
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


def test_core_imports_only_down_its_layers() -> None:
    places = {unit: ROOT.joinpath(*unit.split(".")) for unit in LEVEL}
    missing = [
        unit
        for unit, place in places.items()
        if not (place.with_suffix(".py").is_file() or (place / "__init__.py").is_file())
    ]
    assert missing == []  # a misspelt layer would guard nothing
    assert _upward_in_core() == []


def test_the_check_catches_an_upward_import_inside_core(tmp_path: Path) -> None:
    files = {
        "core/__init__.py": "",
        "core/store/agents.py": "from core.retrieval.embedders import EmbedderIdentity\n",
        "core/retrieval/embedders.py": "from core.store.database import Connection\n",
        "core/llm/limits.py": "import core.store.database\n",
        "core/mystery.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _upward_in_core(tmp_path) == [
        "core/llm/limits.py:1 (core.llm) imports core.store.database (core.store), not below it",
        "core/mystery.py is in no layer of CORE_LAYERS",
        "core/store/agents.py:1 (core.store) imports core.retrieval.embedders (core.retrieval), "
        "not below it",
        "core/store/agents.py:1 (core.store) imports "
        "core.retrieval.embedders.EmbedderIdentity (core.retrieval), not below it",
    ]
