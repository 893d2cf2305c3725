"""The package's shape: small modules, few floors, no circle between its parts.

Read from the source (the import graph of ``test_import_graph.py``), so the tests need no
import of the package. A *part* is what ``docs/architecture.md`` draws: a subpackage of
``asynclock`` (``_lock``, ``state``, ...) or a module at its top level; its *floor* is one more
than the highest floor it imports (a part that imports no other is on floor 1).
"""

from __future__ import annotations

import ast
import functools

from tests.unit.test_import_graph import PACKAGE, cycles, import_graph

#: lines past which a module says why at the top of its docstring ("Size: ...")
LONGEST = 500
#: floors the package may have (issue #25)
FLOORS = 8


def part_of(module: str) -> str:
    """``asynclock._lock.engine`` -> ``asynclock._lock``; a top-level module is its own part."""
    return ".".join(module.split(".")[:2])


def part_graph() -> dict[str, set[str]]:
    """Each part -> the other parts it imports (type-only imports included)."""
    graph: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        part = part_of(module)
        graph.setdefault(part, set()).update(part_of(t) for t in targets if part_of(t) != part)
    return graph


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """The floor of every part of an acyclic ``graph``."""

    @functools.cache
    def floor(part: str) -> int:
        return 1 + max((floor(target) for target in graph[part]), default=0)

    return {part: floor(part) for part in graph}


def test_no_module_is_long_without_saying_why() -> None:
    long_and_silent = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        if source.count("\n") <= LONGEST:
            continue
        docstring = ast.get_docstring(ast.parse(source)) or ""
        if "Size:" not in docstring:
            long_and_silent.append(str(path.relative_to(PACKAGE.parent)))
    assert long_and_silent == []


def test_the_parts_import_each_other_in_no_circle() -> None:
    assert cycles(part_graph()) == []


def test_the_package_stands_on_at_most_eight_floors() -> None:
    levels = floors(part_graph())
    top = max(levels.values())
    assert top <= FLOORS, sorted(levels.items(), key=lambda item: item[1])
    # the layers docs/architecture.md draws: the shared leaves at the bottom, the states above
    # them, the primitives above the states, the dispatcher above every other primitive
    assert levels["asynclock._errors"] == 1
    assert levels["asynclock.state"] < levels["asynclock._lock"] < levels["asynclock._dispatch"]
    assert levels["asynclock._dispatch"] > max(
        levels[p] for p in ("asynclock._inbox", "asynclock._supersede", "asynclock._dedupe")
    )


def test_floors_follow_the_longest_chain() -> None:
    """A guard against a check that cannot fail: a chain of three parts has three floors."""
    assert floors({"a": {"b"}, "b": {"c"}, "c": set()}) == {"a": 3, "b": 2, "c": 1}
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
