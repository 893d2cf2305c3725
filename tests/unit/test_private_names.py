"""No module of the package uses another module's private names.

A private name (one leading underscore) is a module's own business: the next engineer may
rename or remove it reading that module alone. So inside ``asynclock`` no module imports a
private name of another (``from asynclock.x import _name``), and none reaches into an object
for a private attribute or method that the module itself does not define (``lock._take()``
where ``_take`` lives in another file). What one module offers another is a public name of a
private module or internal class: a named interface. ``self._x``, ``cls._x`` and
``super()._x`` are a class's own business (hooks a base class declares included), and the
namedtuple API (``_replace``, ``_asdict``, ...) is public despite its underscore.

Read from the source with ``ast``, so the test needs no import of the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "asynclock"
#: underscore names that are public API of the standard library
PUBLIC_ANYWAY = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_ANYWAY


def _defined_in(tree: ast.AST) -> set[str]:
    """Every name the module defines: functions, classes, assigned names and attributes, and
    the strings of ``__slots__``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return names


def _own(target: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the class's own attributes."""
    if isinstance(target, ast.Name):
        return target.id in ("self", "cls")
    return (
        isinstance(target, ast.Call)
        and isinstance(target.func, ast.Name)
        and target.func.id == "super"
    )


def uses_in(tree: ast.AST, where: str) -> list[str]:
    """``where:line: what`` for every use in ``tree`` of another module's private name."""
    defined = _defined_in(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("asynclock"):
            found += [
                f"{where}:{node.lineno}: imports {node.module}.{alias.name}"
                for alias in node.names
                if _private(alias.name)
            ]
        elif (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and not _own(node.value)
            and node.attr not in defined
        ):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def private_uses() -> list[str]:
    """Every use of another module's private name in the package."""
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE.parent))
        found += uses_in(ast.parse(path.read_text(), where), where)
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    assert private_uses() == []


def test_the_check_sees_both_forms_and_spares_a_class_its_own() -> None:
    """The walk finds what it looks for (guards against a check that cannot fail)."""
    source = (
        "from asynclock._lock.lock import _join, hold\n"
        "class Mine:\n"
        "    def f(self, lock):\n"
        "        self._x = super()._y\n"
        "        return lock._take(), lock._x, cls._z, parts._replace()\n"
    )
    assert uses_in(ast.parse(source), "m.py") == [
        "m.py:1: imports asynclock._lock.lock._join",
        "m.py:5: lock._take",
    ]
