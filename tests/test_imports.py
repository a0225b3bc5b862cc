"""No import circle in the project's packages: every import statement (at the top of a
module, inside a function, or only for type checking) is an arrow from its module to
the module it names, and no module reaches itself by following them."""

from __future__ import annotations

import ast
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("pump", "rdv", "channels", "brokermgr", "mq", "rdvpump", "replay")


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _arrows(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Each module's imports of the project's modules (a name imported from a package
    that is a module of it is that module)."""
    arrows: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    child = f"{source}.{alias.name}"
                    targets.add(child if child in modules else source)
        arrows[name] = {t for t in targets if t in modules and t != name}
    return arrows


def _circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(arrows[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(arrows):
        if v not in index:
            visit(v)
    return found


def test_the_walk_finds_a_circle_where_there_is_one() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_project_imports_itself_through_others() -> None:
    modules = _modules()
    assert {"mq", "replay.fold", "brokermgr._names.service"} <= set(modules)
    circles = _circles(_arrows(modules))
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_every_package_is_installed() -> None:
    """A plain ``pip install`` ships every package directory of the seven (the list in
    pyproject.toml is explicit)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for package in PACKAGES
             for p in (ROOT / package).rglob("__init__.py")}
    assert found - listed == set()
