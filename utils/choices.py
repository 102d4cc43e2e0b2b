"""Closed choices: a keyword whose value is one of a fixed set of strings.

Each set is written once, as a ``typing.Literal`` in the constructor's signature
(``pool: Pooling = "cls"`` with ``Pooling = Literal["cls", "gap"]``). The CLI (LightningCLI /
jsonargparse) reads the annotation: a bad value is rejected while the config is parsed, and
``--help`` lists the allowed ones. Code that builds a module directly in Python bypasses the
parser, so constructors also call :func:`check_choice`, which raises a ValueError naming the
keyword, the value and the allowed values. Module-level tuples (``POOLINGS`` and the like),
where tests and docs iterate over the choices, are ``choices(Pooling)``. A class with several
choices checks them all from its own annotations with :func:`check_annotated_choices`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args, get_origin, get_type_hints


def choices(literal: Any) -> tuple:
    """The allowed values of a ``Literal[...]`` type, in the order written."""
    if get_origin(literal) is not Literal:
        raise TypeError(f"{literal!r} is not a typing.Literal")
    return get_args(literal)


def check_choice(name: str, value: Any, literal: Any) -> None:
    """Raise ValueError unless ``value`` is one of ``literal``'s values (``name`` is the keyword)."""
    allowed = choices(literal)
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {list(allowed)}")


def check_annotated_choices(function: Callable, values: Mapping[str, Any]) -> None:
    """:func:`check_choice` for every argument of ``function`` annotated with a ``Literal``
    (``values``: argument name -> value, e.g. a module's hparams)."""
    for name, hint in get_type_hints(function).items():
        if get_origin(hint) is Literal and name in values:
            check_choice(name, values[name], hint)
