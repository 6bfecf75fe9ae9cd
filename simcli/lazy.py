"""Package attributes that load on first use (PEP 562 module ``__getattr__``), so that a
command importing one name of a package does not import every submodule behind it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_attributes(
    package: str, where: dict[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: a name of ``where`` (name -> defining module) is
    imported on first use and kept in ``namespace`` (the package's ``globals()``)."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
