"""One declaration per setting: a config field holds its type, default, check, variable, flag
and help, and everything else is derived from it.

A config is a frozen dataclass that derives from ``Settings``; each field that a person may set
is declared with ``setting(...)``, and its annotation carries the check as a ``msgspec.Meta``
(``Annotated[float, POSITIVE]``), or ``check=`` says what a type cannot (absolute paths).
``Settings.__post_init__`` runs the checks at construction,
``process.settings_cli`` builds the command line and the config from flags and environment,
and ``settings_rows`` gives the README's table. A field whose type is itself a ``Settings``
class is a group: its settings join its owner's command line.

Adding a setting is one field::

    copy_rps: Annotated[float, POSITIVE] = setting(
        10.0, flag="--lora-copy-rps", env="DYN_LORA_COPY_RPS",
        help="requests/s one adapter copy serves",
    )

Must not name any particular setting: those live on the config that uses them.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import typing
from collections.abc import Callable, Collection, Iterator
from typing import Annotated, Any, Final

import msgspec
from msgspec import Meta

__all__ = [
    "AT_LEAST_ONE",
    "Declared",
    "NON_NEGATIVE",
    "PORT",
    "POSITIVE",
    "Setting",
    "Settings",
    "comma_list",
    "declared",
    "groups",
    "setting",
    "shown_default",
    "walk",
]

POSITIVE: Final = Meta(gt=0)
NON_NEGATIVE: Final = Meta(ge=0)
AT_LEAST_ONE: Final = Meta(ge=1)
PORT: Final = Meta(ge=0, le=65535)

_KEY: Final = "lorafleet.setting"
_DECLARED: Final[dict[type, tuple[Declared, ...]]] = {}
"""``declared``'s answers: resolving a class's annotations once is enough."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setting:
    """How a person sets one config field: its flag, its variable and what it means."""

    help: str
    """One plain sentence for ``--help`` and the README."""
    flag: str | None = None
    env: str | None = None
    choices: Collection[str] | None = None
    """The allowed texts, when the type alone does not say (an enum's values are its own)."""
    parse: Callable[[str], Any] | None = None
    """Turns the text into the value when msgspec cannot (``many``: the list of texts)."""
    shown: str | None = None
    """The default as text, for help and README; with ``parse``, parsed when nothing is set."""
    more: str = ""
    """Markdown the README adds after ``help`` (links, details too long for ``--help``)."""
    many: bool = False
    """The flag may be repeated; ``parse`` gets every text."""
    metavar: str | None = None
    """How ``--help`` names the value; default: the flag's name in capitals."""
    secret: bool = False
    """Kept out of ``repr``; besides ``env``, ``{env}_FILE`` may name a file holding it."""
    check: Callable[[Any], str | None] | None = None
    """What the type cannot say: the rule a value breaks ("absolute paths"), None when good."""

    @property
    def label(self) -> str:
        """How errors name the setting: ``--system-port (DYN_SYSTEM_PORT)``."""
        if self.flag and self.env:
            return f"{self.flag} ({self.env})"
        return self.flag or self.env or ""


def setting(
    default: Any = dataclasses.MISSING,
    *,
    factory: Callable[[], Any] | Any = dataclasses.MISSING,
    secret: bool = False,
    **how: Any,
) -> Any:
    """A dataclass field that a person may set; ``how`` are ``Setting``'s fields.

    ``secret`` keeps the value out of ``repr`` and lets ``{env}_FILE`` name a file that holds
    it (Docker's secrets, compose's generated admin token); give secrets no flag (command
    lines are visible to every user of the machine).
    """
    spec = Setting(secret=secret, **how)
    return dataclasses.field(
        default=default, default_factory=factory, repr=not secret, metadata={_KEY: spec}
    )


@dataclasses.dataclass(frozen=True)
class Declared:
    """One field of a config class with what ``setting`` and its annotation say about it."""

    name: str
    hint: Any
    """The annotation, with its ``Annotated`` check when it has one."""
    spec: Setting | None
    default: Any
    """The default, ``dataclasses.MISSING`` when the field is required or has a factory."""
    required: bool

    @property
    def base(self) -> Any:
        """The type without its check."""
        return typing.get_args(self.hint)[0] if _checked(self.hint) else self.hint

    @property
    def choices(self) -> list[str] | None:
        """The allowed texts: the setting's own, or an enum's values."""
        if self.spec is not None and self.spec.choices is not None:
            return sorted(self.spec.choices)
        if isinstance(self.base, type) and issubclass(self.base, enum.Enum):
            return [str(member.value) for member in self.base]
        return None

    @property
    def rule(self) -> str | None:
        """The check in words when its ``Meta`` has a ``description``, e.g. "non-empty"."""
        metas = typing.get_args(self.hint)[1:] if _checked(self.hint) else ()
        return next((m.description for m in metas if isinstance(m, Meta) and m.description), None)

    def check(self, value: Any) -> None:
        """Raise ``ValueError`` naming the setting when ``value`` breaks its declaration."""
        label = self.spec.label if self.spec is not None and self.spec.label else self.name
        choices = self.spec.choices if self.spec is not None else None
        if choices is not None and value is not None and value not in choices:
            raise ValueError(f"{label} must be one of {sorted(choices)}, got {value!r}")
        broken = self.spec.check(value) if self.spec is not None and self.spec.check else None
        if broken is not None:
            raise ValueError(f"{label} must be {broken}, got {value!r}")
        if _checked(self.hint):
            try:
                msgspec.convert(value, self.hint)
            except msgspec.ValidationError as exc:  # "Expected `int` >= 1": "must be >= 1"
                rule = self.rule or re.sub(r"^Expected `[^`]*` ?", "", str(exc))
                raise ValueError(f"{label} must be {rule}, got {value!r}") from None


class Settings:
    """The base of every config: checks each field against its declaration, once, when built."""

    def __post_init__(self) -> None:
        for item in declared(type(self)):
            item.check(getattr(self, item.name))


def declared(cls: type[Settings]) -> tuple[Declared, ...]:
    """Every field of ``cls`` that is not a group, in declaration order."""
    if cls not in _DECLARED:
        _DECLARED[cls] = _declare(cls)
    return _DECLARED[cls]


def _declare(cls: type[Settings]) -> tuple[Declared, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(
        Declared(
            field.name,
            hints[field.name],
            field.metadata.get(_KEY),
            field.default,
            required=field.default is field.default_factory is dataclasses.MISSING,
        )
        for field in dataclasses.fields(cls)  # type: ignore[arg-type]
        if not _is_group(hints[field.name])
    )


def groups(cls: type[Settings]) -> tuple[tuple[str, type[Settings]], ...]:
    """``(field name, class)`` of each field of ``cls`` that is itself a ``Settings`` class."""
    hints = typing.get_type_hints(cls)
    return tuple((field.name, hints[field.name]) for field in dataclasses.fields(cls)  # type: ignore[arg-type]
                 if _is_group(hints[field.name]))  # fmt: skip


def walk(cls: type[Settings]) -> Iterator[tuple[str, Declared]]:
    """``(dest, field)`` of every field of ``cls`` and of its groups; ``dest`` is dotted."""
    for item in declared(cls):
        yield item.name, item
    for name, group in groups(cls):
        for dest, item in walk(group):
            yield f"{name}.{dest}", item


def shown_default(item: Declared) -> str | None:
    """The default as a person reads it, or None when there is none worth showing."""
    if item.spec is not None and item.spec.shown:
        return item.spec.shown
    value = item.default
    if value is dataclasses.MISSING or value is None or value is False:
        return None
    if isinstance(value, str | tuple) and not value:
        return None
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


def comma_list(text: str) -> tuple[str, ...]:
    """A ``parse`` for comma-separated settings: ``"a, b,,c"`` as ``("a", "b", "c")``."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _checked(hint: Any) -> bool:
    return typing.get_origin(hint) is Annotated


def _is_group(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Settings)
