"""The import order is strictly downward (docs/design.md, code layout): every `import` and `from ...
import` in polar_hpc, at module level or inside a function, relative or absolute, names only a
room (a top-level module or package of polar_hpc) in its own layer or below, and no rooms import
each other round in a cycle. A room no layer names fails too: a new room is placed on purpose.
The scripted engine (`engines.scripted`, a test and demo engine) is a room of its own at the top:
it may build on the proxy's tool parsers, and only the CLI starts it; no production room imports it.
So is `engines.tiny`, the builder of the tiny test model (it starts from the scripted tokenizer)."""

from __future__ import annotations

import ast
from pathlib import Path

import polar_hpc

# bottom to top; a room imports only from its own layer and the layers before it
# (suites: task suites as data, from config; observe: a run's view, read from its shards and shown
# by launch and the CLI; they sit where their imports put them.)
LAYERS = [
    {"polar_hpc", "errors", "wire", "metrics", "config", "config_files", "security", "procs", "assets", "nofollow"},
    {"shards", "trajectory", "sandbox", "engines", "suites"},
    {"proxy", "harness"},
    {"gateway"},
    {"orchestrator", "observe"},
    {"launch"},
    {"client", "cli", "__main__", "engines.scripted", "engines.tiny"},
]


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    parts = module.split(".")[1:] or ["polar_hpc"]
    sub = ".".join(parts[:2])
    return sub if any(sub in rooms for rooms in LAYERS) else parts[0]


def imports(root: Path) -> list[tuple[str, int, str, str]]:
    """(file, line, importing module, imported polar_hpc module) for every import under `root`."""
    files = sorted(root.rglob("*.py"))
    known = {_module(p, root) for p in files}
    found = []
    for path in files:
        module = _module(path, root)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in known:  # polar_hpc.wire.Message -> polar_hpc.wire
                    name = name.rpartition(".")[0]
                if name:
                    found.append((str(path.relative_to(root.parent)), node.lineno, module, name))
    return found


def violations(root: Path) -> list[str]:
    layer = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
    problems, graph = [], {}
    for path, line, module, target in imports(root):
        src, dst = _room(module), _room(target)
        unplaced = [room for room in (src, dst) if room not in layer]
        if unplaced:
            problems += [f"{path}:{line}: room {room!r} is in no layer of tests/test_layers.py" for room in unplaced]
            continue
        if src != dst:
            graph.setdefault(src, set()).add(dst)
        if layer[dst] > layer[src]:
            problems.append(f"{path}:{line}: {module} imports {target}, a layer above it ({src} < {dst})")
    problems += [f"rooms import each other round: {' -> '.join(c)}" for c in _cycles(graph)]
    return list(dict.fromkeys(problems))  # one line per place, however many names it imports


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """A cycle back to each room that lies on one, named from its alphabetically first room, once."""
    cycles = []
    for start in sorted(graph):
        stack, seen = [[start]], {start}
        while stack:
            path = stack.pop()
            if start in graph.get(path[-1], ()):
                if min(path) == start and path + [start] not in cycles:
                    cycles.append(path + [start])
                break
            for nxt in sorted(graph.get(path[-1], ())):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(path + [nxt])
    return cycles


def test_polar_hpc_imports_only_downward() -> None:
    root = Path(polar_hpc.__file__).parent
    assert len(imports(root)) > 100  # the parser sees the imports at all
    assert violations(root) == []


def test_a_planted_upward_import_or_cycle_is_caught(tmp_path: Path) -> None:
    root = tmp_path / "polar_hpc"
    planted = {
        "__init__.py": "",
        "cli.py": "",
        "wire.py": "import json\n\ndef f():\n    from polar_hpc.cli import app\n",  # upward, in a function
        "shards/__init__.py": "from ..trajectory import model\n",  # the same layer...
        "trajectory/__init__.py": "",
        "trajectory/model.py": "import polar_hpc.shards.x\n",  # ...and back: a cycle
        "gateway/__init__.py": "from polar_hpc import newroom, wire\n",  # wire: downward, fine
        "proxy/__init__.py": "from polar_hpc.engines.scripted import chat\n",  # production on the test engine
        "engines/scripted/chat.py": "from polar_hpc.proxy import tool_parsers\n",  # fine: it sits on top
        "proxy/tool_parsers.py": "",
        "newroom.py": "",
    }
    for name, text in planted.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert violations(root) == [
        "polar_hpc/gateway/__init__.py:1: room 'newroom' is in no layer of tests/test_layers.py",
        "polar_hpc/proxy/__init__.py:1: polar_hpc.proxy imports polar_hpc.engines.scripted.chat, a layer above it "
        "(proxy < engines.scripted)",
        "polar_hpc/wire.py:4: polar_hpc.wire imports polar_hpc.cli, a layer above it (wire < cli)",
        "rooms import each other round: engines.scripted -> proxy -> engines.scripted",
        "rooms import each other round: shards -> trajectory -> shards",
    ]
