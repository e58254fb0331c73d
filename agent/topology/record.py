"""`record`: frozen value classes declared by annotated fields, like `@dataclass(frozen=True, slots=True)`.

`topolet discover` runs as a whole process, and importing `dataclasses` (with `inspect` and `ast`)
plus compiling each class's methods costs it more than the scan.  A record class is built in
microseconds and behaves as topolet uses dataclasses: construction by position or keyword,
`==`/`hash` over the fields, the dataclass `repr`, immutability, pickling, `copy`; `fields_of`,
`is_record` and `replace` stand in for their namesakes.  A class with a `cached_property` (this
module's) keeps an instance `__dict__` and can be weakly referenced.  Type checkers see a frozen
dataclass (PEP 681).
"""

from __future__ import annotations

from operator import attrgetter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from functools import cached_property as cached_property
    from typing import Any, TypeVar, dataclass_transform

    T = TypeVar("T")
else:

    def dataclass_transform(**_: object) -> object:
        return lambda f: f

    class cached_property:
        """A method's value, computed on first read and kept in the instance `__dict__` (as functools').

        Without the lock Python 3.12 dropped from functools' too: two threads may both compute it.
        """

        def __init__(self, func):
            self.func = func
            self.attrname = None
            self.__doc__ = func.__doc__

        def __set_name__(self, owner, name):
            self.attrname = name

        def __get__(self, instance, owner=None):
            if instance is None:
                return self
            value = instance.__dict__[self.attrname] = self.func(instance)
            return value


class _Record:
    """The methods every record class shares; `_fields`, `_defaults` and `_get` are per class."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _defaults: dict[str, object] = {}

    def __init__(self, *args: object, **kwargs: object) -> None:
        fields = self._fields
        name = type(self).__name__
        if len(args) > len(fields):
            raise TypeError(f"{name}() takes {len(fields)} arguments but {len(args)} were given")
        setter = object.__setattr__
        for field, value in zip(fields, args, strict=False):
            setter(self, field, value)
        defaults = self._defaults
        for field in fields[len(args) :]:
            if field in kwargs:
                value = kwargs.pop(field)
            elif field in defaults:
                value = defaults[field]
            else:
                raise TypeError(f"{name}() missing argument {field!r}")
            setter(self, field, value)
        if kwargs:
            raise TypeError(f"{name}() got unexpected or repeated arguments {sorted(kwargs)}")

    @staticmethod
    def _get(value: object) -> tuple[object, ...]:
        raise NotImplementedError  # replaced per class by a C-speed attrgetter of every field

    def _values(self) -> tuple[object, ...]:
        return self._get(self)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a frozen {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a frozen {type(self).__name__}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._get(self) == self._get(other)

    def __hash__(self) -> int:
        return hash(self._get(self))

    def __repr__(self) -> str:
        body = ", ".join(f"{f}={v!r}" for f, v in zip(self._fields, self._values(), strict=True))
        return f"{type(self).__qualname__}({body})"

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (type(self), self._get(self))


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    """Turn a class of annotated fields (defaults allowed, last) into a frozen record class."""
    body = dict(cls.__dict__)
    fields = tuple(body.get("__annotations__", {}))
    defaults = {f: body.pop(f) for f in fields if f in body}
    body.pop("__dict__", None)
    body.pop("__weakref__", None)
    keeps_dict = any(isinstance(v, cached_property) for v in body.values())
    body["__slots__"] = fields + (("__dict__", "__weakref__") if keeps_dict else ())
    body["__match_args__"] = fields
    body["_fields"] = fields
    body["_defaults"] = defaults
    get = attrgetter(*fields)
    body["_get"] = staticmethod((lambda value: (get(value),)) if len(fields) == 1 else get)
    return type(cls.__name__, (_Record,), body)


def is_record(value: object) -> bool:
    """Whether `value` is an instance of a record class."""
    return isinstance(value, _Record)


def fields_of(value: object) -> tuple[str, ...]:
    """The field names of a record (instance or class), in declaration order."""
    fields: tuple[str, ...] = value._fields  # type: ignore[attr-defined]
    return fields


def replace(value: T, **changes: Any) -> T:
    """A copy of the record `value` with some fields changed."""
    current = dict(zip(fields_of(value), value._values(), strict=True))  # type: ignore[attr-defined]
    current.update(changes)
    return type(value)(**current)
