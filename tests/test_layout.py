"""The tree is the architecture: the package's import graph, read from the source, keeps its rules.

Rooms sit in layers, lowest first; a module imports only its own layer and those below it. No
file cycles. Generated protobuf code (and the protobuf runtime) only in `protocol/` and the
service layer; everyone else reaches the protocol through its door (`import protocol`).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("devices", "protocol", "orchestrator")
LAYERS = [  # lowest first
    ("devices",),
    ("protocol",),
    ("orchestrator", "orchestrator.errors", "orchestrator.config"),
    ("orchestrator.tracing",),
    ("orchestrator.models",),
    ("orchestrator.profiles",),
    ("orchestrator.engine",),
    ("orchestrator.mtp",),
    ("orchestrator.drafters",),
    ("orchestrator.server",),
    ("orchestrator.assemble",),
    ("orchestrator.cluster",),
    ("orchestrator.latency",),
    ("orchestrator.cli",),
]
PROTOBUF_ALLOWED = ("protocol", "orchestrator.server")
GENERATED = "protocol.pb"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    files = [f for p in PACKAGES for f in (ROOT / p).rglob("*.py")]
    return {_module_name(f): f for f in files if not _module_name(f).startswith(GENERATED)}


def _imports(path: Path, module: str, text: str) -> list[tuple[str, int]]:
    """(absolute name, line) of every import in the file, relative ones resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found += [(f"{base}.{a.name}", node.lineno) for a in node.names] + [(base, node.lineno)]
    return found


def _owner(name: str, modules: dict) -> str | None:
    """The project module an imported name lives in (a submodule, or the attribute of one)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _layer(module: str) -> int:
    best = None
    for i, rooms in enumerate(LAYERS):
        for room in rooms:
            if (module == room or module.startswith(room + ".")) and (best is None or len(room) > len(best[1])):
                best = (i, room)
    assert best is not None, f"{module} is in no layer: add its room to LAYERS"
    return best[0]


def _graph(extra: dict[Path, str] | None = None):
    """The import graph; `extra` adds made-up files (path -> source) to check the checks."""
    modules = _sources()
    texts = {path: text for path, text in (extra or {}).items()}
    modules.update({_module_name(path): path for path in texts})
    edges: dict[str, set[str]] = {m: set() for m in modules}
    protobuf, reach_ins = [], []
    for module, path in modules.items():
        text = texts[path] if path in texts else path.read_text()
        for name, line in _imports(path, module, text):
            where = f"{path.relative_to(ROOT)}:{line}"
            if name.startswith(GENERATED) or name.startswith("google.protobuf"):
                if not module.startswith(PROTOBUF_ALLOWED):
                    protobuf.append(f"{where} imports {name}")
                continue
            owner = _owner(name, modules)
            if owner and owner.startswith("protocol.") and not module.startswith("protocol"):
                line_ = f"{where} imports {owner} (use the door: `import protocol`)"
                reach_ins += [line_] if line_ not in reach_ins else []
            if owner is not None and owner != module:
                edges[module].add(owner)
    return modules, edges, protobuf, reach_ins


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph():
    return _graph()


def test_the_graph_is_read_from_every_package(graph):
    modules, edges, _, _ = graph
    assert {"orchestrator.engine.engine", "orchestrator.server.remote_drafter", "protocol.codec",
            "devices.registry", "orchestrator.cli.generate"} <= set(modules)
    assert "orchestrator.models" in edges["orchestrator.engine.engine"]  # imports are really seen
    for module in modules:
        _layer(module)


def test_no_file_cycles(graph):
    assert _cycles(graph[1]) == []


def test_no_import_points_up_the_layers(graph):
    _, edges, _, _ = graph
    upward = [f"{m} -> {t}" for m, targets in edges.items() for t in sorted(targets) if _layer(t) > _layer(m)]
    assert upward == []


def test_protobuf_only_in_the_protocol_and_the_service_layer(graph):
    assert graph[2] == []


def test_callers_use_the_protocol_door(graph):
    assert graph[3] == []


def test_the_checks_catch_what_they_are_for():
    """The rules fail on a made-up cycle, an upward import and a stray protobuf import."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert _layer("orchestrator.engine.engine") < _layer("orchestrator.server.generation")
    assert _layer("orchestrator.config") < _layer("orchestrator.tracing") < _layer("orchestrator.cli.serve")
    fake = ROOT / "orchestrator" / "engine" / "_layout_probe.py"  # never written: read from `extra`
    modules, edges, protobuf, reach_ins = _graph({fake: "from orchestrator.server import EngineLoop\n"
                                                        "from protocol.pb import blocks_pb2\n"
                                                        "from protocol.codec import encode\n"})
    assert "orchestrator.server" in edges["orchestrator.engine._layout_probe"]
    assert _layer("orchestrator.server") > _layer("orchestrator.engine._layout_probe")
    assert protobuf == ["orchestrator/engine/_layout_probe.py:2 imports protocol.pb.blocks_pb2",
                        "orchestrator/engine/_layout_probe.py:2 imports protocol.pb"]
    assert reach_ins == ["orchestrator/engine/_layout_probe.py:3 imports protocol.codec (use the door: `import protocol`)"]


def _ray_imports(files: dict[str, tuple[Path, str]]) -> list[str]:
    """Imports of ray outside `orchestrator.cluster` (the `[ray]` extra's only room)."""
    found = []
    for module, (path, text) in files.items():
        if module == "orchestrator.cluster" or module.startswith("orchestrator.cluster."):
            continue
        found += [f"{path.relative_to(ROOT)}:{line} imports {name}" for name, line in _imports(path, module, text)
                  if name == "ray" or name.startswith("ray.")]
    return found


def test_only_the_cluster_room_imports_ray():
    files = {module: (path, path.read_text()) for module, path in _sources().items()}
    assert _ray_imports(files) == []
    probe = ROOT / "orchestrator" / "engine" / "_ray_probe.py"  # never written
    assert _ray_imports({"orchestrator.engine._ray_probe": (probe, "import ray.util\n")}) == [
        "orchestrator/engine/_ray_probe.py:1 imports ray.util"]
