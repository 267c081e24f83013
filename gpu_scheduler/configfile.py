"""Reading a component's YAML configuration file, with errors that name the file."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def load_yaml_file(path: str, parse: Callable[[Any], T], error: type[ValueError]) -> T:
    """``parse(yaml of path)``; a YAML or ``error`` problem comes back as ``error``
    prefixed with the path."""
    with open(path, encoding="utf-8") as handle:
        try:
            data = yaml.safe_load(handle)
        except yaml.YAMLError as exc:
            raise error(f"{path}: not YAML: {exc}") from exc
    try:
        return parse(data)
    except error as exc:
        raise error(f"{path}: {exc}") from exc
