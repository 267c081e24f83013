"""Reading Kubernetes objects in their JSON form, where any field may have any type.

Objects reach us from clients we do not control: a label value may be a number,
``status.allocatable`` a list, ``metadata`` a string. These helpers read one field
with the type the API defines, treat ``null`` and absent alike (as the API server's
decoder does), and raise :class:`FieldError` naming the field otherwise, so every
caller can turn bad input into an answer instead of an ``AttributeError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_scheduler.quantity import type_name
from gpu_scheduler.textclip import clip

_EMPTY: Mapping[str, Any] = {}


class FieldError(ValueError):
    """A field with the wrong type or an unusable value; ``path`` names it.

    ``wrong_type`` tells the two apart: an API server never sends a wrong type (it
    decoded the object into its Go type first), but it may send a value it has not
    validated yet (admission runs before validation), such as a fractional GPU count.
    """

    def __init__(self, path: str, problem: str, *, wrong_type: bool = True) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem
        self.wrong_type = wrong_type


def expect_object(value: Any, path: str) -> Mapping[str, Any]:
    """``value`` itself as an object (``null``: empty)."""
    if value is None:
        return _EMPTY
    if type(value) is not dict and not isinstance(value, Mapping):  # (a dict: no ABC check)
        raise FieldError(path, f"must be an object, not {type_name(value)}")
    return value


def object_at(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    """``parent[key]`` as an object; absent or ``null``: empty. ``path`` names ``key``."""
    value = parent.get(key)
    if value is None:
        return _EMPTY
    if type(value) is not dict and not isinstance(value, Mapping):
        raise FieldError(path, f"must be an object, not {type_name(value)}")
    return value


def list_at(parent: Mapping[str, Any], key: str, path: str) -> list[Any]:
    """``parent[key]`` as an array; absent or ``null``: empty."""
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise FieldError(path, f"must be an array, not {type_name(value)}")
    return value


def string_at(parent: Mapping[str, Any], key: str, path: str) -> str | None:
    """``parent[key]`` as a string; absent or ``null``: None."""
    value = parent.get(key)
    if value is None or isinstance(value, str):
        return value
    raise FieldError(path, f"must be a string, not {type_name(value)} ({clip(value, 64)})")


def is_integer(value: Any) -> bool:
    """Whether ``value`` is a JSON integer (Python's ``bool`` is an ``int``, not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def key_path(path: str, key: str) -> str:
    """``path["a/b"]`` for map keys that are not identifiers, else ``path.key``."""
    return f"{path}.{key}" if key.isidentifier() else f'{path}["{key}"]'
