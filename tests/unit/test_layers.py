"""The architecture, checked: dependencies point downward and nothing imports in a circle.

Imports are read from the source (every ``import`` that runs, at module level or in a
function; those under ``if TYPE_CHECKING:`` are for the type checker only), so the test
sees what ``python -c "import ..."`` would load, and also lazy imports that hide a cycle.
Core is held to more: no cycle even counting its ``TYPE_CHECKING`` imports, since a
lower module that names a higher one's type is a lower object that knows its caller
(queues name the ``QueueHost`` protocol, not the vhost).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "leveret"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, modules: set[str], typing: bool = False) -> set[str]:
    """The leveret modules ``path`` imports at run time (``typing``: and for the type
    checker, under ``if TYPE_CHECKING:``)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not typing:
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("leveret"))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if not target.startswith("leveret"):
                    continue
                for alias in child.names:  # `from .x import y` may name a module y
                    sub = f"{target}.{alias.name}"
                    found.add(sub if sub in modules else target)
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(name)
    return {m for m in found if m in modules}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    paths = list(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) for p in paths}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_import_cycles(graph):
    assert not _cycles(graph)


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: Import edges in core allowed to close a cycle through ``TYPE_CHECKING``, each with
#: why it cannot be avoided. None: every protocol a lower module needs of a higher one
#: is declared in the lower one (``queues.host.QueueHost``, ``router.Router``,
#: ``recovery.RecoveringBroker``, ``dead_letter_actions.JobsHost``, ...).
ALLOWED_TYPING_EDGES: set[tuple[str, str]] = set()


@pytest.fixture(scope="module")
def typed_core_graph() -> dict[str, set[str]]:
    paths = list(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    core = {_module_name(p): _imports(p, modules, typing=True) for p in paths
            if _module_name(p).startswith("leveret.core")}
    return {m: {d for d in deps if d in core and (m, d) not in ALLOWED_TYPING_EDGES}
            for m, deps in core.items()}


def test_no_import_cycles_in_core_counting_type_checking_imports(typed_core_graph):
    assert not _cycles(typed_core_graph)


def test_type_checking_imports_are_counted_when_asked(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    package = tmp_path / "leveret"
    package.mkdir()
    module = package / "low.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .high import High\n")
    modules = {"leveret.low", "leveret.high"}
    assert _imports(module, modules, typing=True) == {"leveret.high"}
    assert _imports(module, modules) == set()


@pytest.mark.parametrize("layer,forbidden", [
    ("leveret.amqp", ("leveret.core", "leveret.protocol", "leveret.server", "leveret.store",
                      "leveret.spark", "leveret.tools", "leveret.management")),
    ("leveret.core", ("leveret.protocol", "leveret.server", "leveret.amqp", "leveret.spark",
                      "leveret.tools", "leveret.management", "leveret.cli")),
    ("leveret.protocol", ("leveret.server", "leveret.spark", "leveret.tools", "leveret.cli")),
    ("leveret.store", ("leveret.core", "leveret.protocol", "leveret.server")),
    # Clients of a broker: over AMQP (and HTTP), never its insides, so they work against
    # any leveret or RabbitMQ. Shovels run inside the broker and read their definitions
    # from core, but move messages over AMQP too.
    ("leveret.tools", ("leveret.core", "leveret.protocol", "leveret.server", "leveret.store",
                       "leveret.management", "leveret.cli", "leveret.spark", "leveret.shovel",
                       "leveret.federation")),
    ("leveret.spark", ("leveret.core", "leveret.protocol", "leveret.server", "leveret.store",
                       "leveret.management", "leveret.cli", "leveret.tools", "leveret.shovel")),
    ("leveret.shovel", ("leveret.protocol", "leveret.server", "leveret.store", "leveret.management",
                        "leveret.cli", "leveret.tools", "leveret.spark", "leveret.federation")),
    # Federation links are clients too (AMQP to both sides); the management API and
    # the control socket read their definitions' checks and their status.
    ("leveret.federation", ("leveret.protocol", "leveret.server", "leveret.store", "leveret.management",
                            "leveret.cli", "leveret.tools", "leveret.spark")),
])
def test_dependencies_point_down(graph, layer, forbidden):
    bad = sorted((m, d) for m, deps in graph.items() if m.startswith(layer)
                 for d in deps if d.startswith(forbidden))
    assert not bad, f"{layer} imports a layer above it: {bad}"


def _loaded_by(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_leveret_is_light():
    loaded = _loaded_by("import leveret")
    assert not {m for m in loaded if m.startswith(("leveret.server", "leveret.store", "aiohttp"))}


def test_core_loads_no_event_loop_or_protocol():
    loaded = _loaded_by("import leveret.core, leveret.core.publish")
    assert not {m for m in loaded if m.startswith(("leveret.server", "leveret.protocol",
                                                   "leveret.amqp", "aiohttp", "uvloop"))}
    assert "asyncio" not in loaded


def test_amqp_codec_is_a_leaf():
    loaded = _loaded_by("import leveret.amqp.frames, leveret.amqp.properties, leveret.amqp.field_table")
    assert {m for m in loaded if m.startswith("leveret")} <= {
        "leveret", "leveret.version", "leveret.amqp", "leveret.amqp.errors", "leveret.amqp.frames",
        "leveret.amqp.properties", "leveret.amqp.field_table", "leveret.amqp.methods",
        # the compiled twins of frames.py and field_table.py, and the stdlib-only module
        # that selects them
        "leveret.amqp._cframes", "leveret.amqp._cfield_table", "leveret.compiled"}


def test_ctl_loads_no_protocol_adapter_or_broker():
    # `leveret ctl` talks to the control socket and reads ConnectionFacts: neither it nor
    # the command group it comes with needs an adapter, the event loop or the server.
    loaded = _loaded_by("import leveret.cli.ctl")
    assert not {m for m in loaded if m.startswith(("leveret.protocol", "leveret.amqp",
                                                   "leveret.server.broker", "leveret.server.control",
                                                   "aiohttp", "uvloop"))}


def test_the_control_socket_reads_connection_facts_only():
    # server/control.py lists and closes every adapter's connections through core's
    # registry (ConnectionFacts, close_by_operator): it names no adapter class.
    loaded = _loaded_by("import leveret.server.control")
    assert not {m for m in loaded if m.startswith("leveret.protocol")}
