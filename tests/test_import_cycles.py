"""The modules of `hf_elmo` import each other without a cycle: each can be read (and loaded) after the ones it
imports. The graph is read from the source, every `from .x import` / `from hf_elmo.x import` / `import hf_elmo.x`,
those inside functions included."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hf_elmo"


def module_names(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its `__init__.py`)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that the module `name` (file `path`) imports."""
    is_package = path.name == "__init__.py"
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:  # `from . import x`: x may be a module of its own
                imported.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {module for module in imported if module in modules and module != name}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules, as a chain `[a, b, ..., a]` (Tarjan's algorithm
    for the groups, then a path back to the group's first module within it)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    chains = []
    for group in groups:
        start = min(group)
        paths, seen = [[start]], {start}
        while paths:  # breadth first: the shortest way back to `start`
            path = paths.pop(0)
            successors = sorted(graph[path[-1]] & group)
            if start in successors:
                chains.append(path + [start])
                break
            for successor in successors:
                if successor not in seen:
                    seen.add(successor)
                    paths.append(path + [successor])
    return sorted(chains)


def test_the_graph_is_read_from_every_kind_of_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .a import f\n")
    (package / "a.py").write_text("def f():\n    from .sub import b\n    return b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("from .. import d\nfrom ..c import g\n")
    (package / "c.py").write_text("import os\nimport pkg.a\n\ng = 1\n")
    (package / "d.py").write_text("import json\n")
    graph = import_graph(package)
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.sub.b"},
        "pkg.c": {"pkg.a"},
        "pkg.d": set(),
        "pkg.sub": set(),
        "pkg.sub.b": {"pkg.c", "pkg.d"},
    }
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
    (package / "c.py").write_text("g = 1\n")
    assert cycles(import_graph(package)) == []


def test_no_import_cycle():
    found = [" -> ".join(chain) for chain in cycles(import_graph())]
    assert found == [], "import cycles: " + "; ".join(found)


def test_only_the_command_line_imports_the_commands():
    def is_command_line(module):
        return (
            module == "hf_elmo.commands.cli" or module == "hf_elmo.commands" or module.startswith("hf_elmo.commands.")
        )

    importers = sorted(
        name
        for name, imported in import_graph().items()
        if not is_command_line(name) and any(is_command_line(module) for module in imported)
    )
    assert importers == []


FLOORS = {"flat": 0, "io": 1, "training": 2, "convert": 2, "features": 2, "commands": 3, "compat": 3}
"""The floors of the package, from the bottom: the modules a saved model and its tokenizer carry (flat in
`hf_elmo/`), the commands' files, the wings (training, the formats, the features: one floor, they may import each
other), the command line and the other projects' APIs. `hf_elmo/__init__.py`, the package's front door, may import
any floor."""


def floor_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in FLOORS) else "flat"


def test_no_import_goes_up_a_floor():
    upward = sorted(
        f"{name} -> {module}"
        for name, imported in import_graph().items()
        if name != "hf_elmo"
        for module in imported
        if FLOORS[floor_of(module)] > FLOORS[floor_of(name)]
    )
    assert upward == []


def reached_from(module: str, graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for imported in graph[todo.pop()] - seen:
            seen.add(imported)
            todo.append(imported)
    return seen


COMPUTE_MODULES = {  # the kernels and what chooses between them (`compute_paths`, the paths' description, is neither)
    "hf_elmo.paths_resolution",
    "hf_elmo.cpu_kernels",
    "hf_elmo.onednn_linear",
    "hf_elmo.cpu_threads",
    "hf_elmo.cpu_backend",
    "hf_elmo.triton_support",
    "hf_elmo.cuda_graphs",
    "hf_elmo.char_cnn_fast",
    "hf_elmo.char_cnn_triton",
    "hf_elmo.lstm_sorted",
    "hf_elmo.lstm_static",
    "hf_elmo.lstm_triton",
    "hf_elmo.sampled_softmax",
    "hf_elmo.sampled_softmax_triton",
}


def test_the_config_and_the_tokenizer_import_nothing_of_the_compute_paths():
    graph = import_graph()
    for module in ("hf_elmo.configuration_elmo", "hf_elmo.tokenization_elmo"):
        assert sorted(reached_from(module, graph) & COMPUTE_MODULES) == [], module
