"""One way to make a component available by name: tasks, patterns, normalisers, regularisers, paper tables.

Every kind of component has one `Registry`. A component registers itself where it is defined, with a
decorator that may attach its config schema (fairseq's `@register_task(name, dataclass=...)` idea):

    NORMALISERS = Registry("normaliser", package="sparse_runner.attention", entry_points="sparse_runner.normalisers")

    @NORMALISERS.register("sparsemax")
    class Sparsemax(Normaliser): ...

Looking a name up (`registry[name]`, `registry.names()`) first imports what may register more:
every module of `package` (so a new component is one new module there) and every entry point of the
group `entry_points` (so another installed package can add components without touching this one:
`[project.entry-points."sparse_runner.normalisers"] mine = "my_package.attention"`).
An unknown name is a ValueError that names the valid ones. Torch-free, so the report can use it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """name -> component for one kind of component (see the module docstring)."""

    def __init__(self, kind: str, *, package: str | None = None, entry_points: str | None = None) -> None:
        self.kind, self.package, self.entry_points = kind, package, entry_points
        self._items: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str, **attributes: Any) -> Callable[[T], T]:
        """Decorator: make the decorated object available as `name`; `attributes` are set on it
        (`config=TaskConfig` becomes `obj.config`), and so is `name`, where the object takes attributes."""

        def add(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is registered twice ({_describe(self._items[name])}, {_describe(obj)})")
            for key, value in {"name": name, **attributes}.items():
                try:
                    setattr(obj, key, value)
                except (AttributeError, TypeError):  # a module or builtin that takes no attributes keeps its own
                    pass
            self._items[name] = obj
            return obj

        return add

    def add(self, name: str, obj: T, **attributes: Any) -> T:
        """`register` as a call, for objects that are not defined with a decorator (modules, lambdas)."""
        return self.register(name, **attributes)(obj)

    def load(self) -> dict[str, T]:
        """Import the package's modules and the entry points once; every registered component by name."""
        if not self._loaded:
            self._loaded = True
            if self.package:
                package = importlib.import_module(self.package)
                for module in pkgutil.iter_modules(getattr(package, "__path__", [])):
                    importlib.import_module(f"{self.package}.{module.name}")
            if self.entry_points:
                for entry_point in importlib.metadata.entry_points(group=self.entry_points):
                    entry_point.load()
        return self._items

    def names(self) -> list[str]:
        return sorted(self.load())

    def __contains__(self, name: object) -> bool:
        return name in self.load()

    def __getitem__(self, name: str) -> T:
        items = self.load()
        if name not in items:
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(items)) or '(none)'}")
        return items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.load())

    def __len__(self) -> int:
        return len(self.load())

    def items(self):
        return self.load().items()

    def values(self):
        return self.load().values()


def _describe(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
