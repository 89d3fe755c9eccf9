"""The package's import structure: layers in a fixed order, no cycles.

Every import counts, function-local ones included: a module may import only from its own layer or a
lower one, and the module graph has no cycle. The layers, bottom to top, are docs/design.md's table:
the jobs (check, run, write, record) sit below the two front ends, the server and the command line,
and the server imports nothing of the command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import wanjax

ROOT = Path(wanjax.__file__).parent
LAYERS = (
    "base",
    "io",
    "runtime",
    "kernels",
    "parallel",
    "models",
    "sampling",
    "pipeline",
    "planning",
    "jobs",
    "tools",
    "server",
    "cli",
    "api",
)
APART = {"server": ("cli", "tools")}  # a layer must not import these, whatever the order says
BASE = {"wanjax.chips", "wanjax.errors", "wanjax.target", "wanjax.version"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def layer(module: str) -> str:
    if module in BASE:
        return "base"
    if module == "wanjax":
        return "api"
    return module.split(".")[1]


def imports(module: str) -> set[str]:
    """The wanjax modules ``module`` imports anywhere in its body (``from pkg import sub`` names the
    submodule when ``sub`` is one; ``library("wanjax.x", ...)`` names ``wanjax.x``)."""
    tree = ast.parse(MODULES[module].read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "library" and node.args:
            first = node.args[0]  # wanjax.jobs.flags.library("wanjax.x", NAME): imported when read
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
    return {m for m in found if m in MODULES and m != module}


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_has_a_known_layer():
    unknown = sorted(m for m in MODULES if layer(m) not in LAYERS)
    assert not unknown, f"modules outside the layers {LAYERS}: {unknown}"


def test_no_import_goes_up_the_layers():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted(
        f"{m} ({layer(m)}) imports {d} ({layer(d)})"
        for m, deps in GRAPH.items()
        for d in deps
        if rank[layer(d)] > rank[layer(m)]
    )
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def imports_across(graph: dict[str, set[str]], apart: dict[str, tuple[str, ...]]) -> list[str]:
    """Each import of a module of a layer in ``apart`` from a layer it must stay apart from."""
    return sorted(
        f"{m} imports {d}" for m, deps in graph.items() for d in deps if layer(d) in apart.get(layer(m), ())
    )


def test_the_server_imports_nothing_of_the_cli_or_the_developer_tools():
    """The server runs the jobs; it plans with the run-time planning code, never a developer command."""
    across = imports_across(GRAPH, APART)
    assert not across, "the server imports the command line or tools/:\n" + "\n".join(across)


MAX_LINES = 600  # a module longer than this does more than one job


def long_modules(lines: dict[str, int], limit: int = MAX_LINES) -> list[str]:
    return sorted(f"{m}: {n} lines" for m, n in lines.items() if n > limit)


def test_no_module_is_over_600_lines():
    lines = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    assert not long_modules(lines), "split these modules:\n" + "\n".join(long_modules(lines))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return [*path[path.index(d) :], d]
            if d not in state and (cycle := visit(d)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_no_import_cycle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_catch_what_they_should():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert layer("wanjax.models.vae.model") == "models" and layer("wanjax.errors") == "base"
    assert "wanjax.io.checkpoint" in GRAPH["wanjax.models.dit"]
    assert "wanjax.kernels.precision" in GRAPH["wanjax.jobs.groups"]  # a function-local import
    assert "wanjax.jobs.generate" in GRAPH["wanjax.server.engine"]
    server_to_cli = {"wanjax.server.serve": {"wanjax.cli.parser"}, "wanjax.cli.parser": set()}
    assert imports_across(server_to_cli, APART) == ["wanjax.server.serve imports wanjax.cli.parser"]
    assert imports_across(GRAPH, {"cli": ("jobs",)})  # the command line does import the jobs
    assert long_modules({"a": 601, "b": 600}) == ["a: 601 lines"]
