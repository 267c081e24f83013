"""Reading a component's YAML configuration file, with errors that name the file."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def load_yaml_file(path: str, parse: Callable[[Any], T], error: type[ValueError]) -> T:
    """``parse(yaml of path)``; a file, YAML or ``error`` problem comes back as
    ``error`` prefixed with the path."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        raise error(f"{path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise error(f"{path}: not YAML: {exc}") from exc
    try:
        return parse(data)
    except error as exc:
        raise error(f"{path}: {exc}") from exc


def checked_mapping(
    data: Any, known: set[str] | frozenset[str], error: type[ValueError]
) -> Mapping[str, Any]:
    """``data`` as a mapping with only ``known`` keys (None: empty), else ``error``."""
    data = data or {}
    if not isinstance(data, Mapping):
        raise error("the config must be a YAML mapping")
    unknown = set(data) - set(known)
    if unknown:
        raise error(f"unknown config keys {sorted(unknown)}; known: {sorted(known)}")
    return data
