"""The one line of figures a test prints for the reader (``pytest -s`` shows it).

``docs/reliability.md`` and the issues' closing notes quote these lines; a test's assertions
never depend on them.
"""

from __future__ import annotations


def figures(**named: object) -> str:
    """``name=value`` pairs; a ``float`` is seconds, shown in milliseconds."""
    return " ".join(
        f"{name}={value * 1000:.0f}ms" if isinstance(value, float) else f"{name}={value}"
        for name, value in named.items()
    )


def report(test: str, /, **named: object) -> None:
    """Print one line: ``[figures] <test>: name=value ...`` (see :func:`figures`)."""
    print(f"\n[figures] {test}: {figures(**named)}")
