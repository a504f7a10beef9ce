"""A config's command line, its values from flags and environment, and its README rows, all
derived from its ``setting`` declarations (``process.settings``).

A flag wins over its variable, and a blank variable counts as unset. Text is turned into a
value by msgspec (``strict=False``: ``"9345"`` is an int), by the setting's ``parse``, or for a
bool from true/false words; a bad text or value stops the process with one usage line that
names the flag or the variable, never a traceback. ``settings_from_env`` builds a config from
variables alone, for code that has no command line (Dynamo's ``LoRAManager()``). Must not name
any particular setting.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeVar

import msgspec

from lorafleet.process.settings import Declared, Settings, declared, groups, shown_default, walk

__all__ = [
    "SettingRow",
    "add_settings",
    "parse_settings",
    "setting_rows",
    "settings_from_args",
    "settings_from_env",
]

C = TypeVar("C", bound=Settings)

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


class SettingRow(NamedTuple):
    """One setting as the README's configuration table shows it."""

    env: str
    flag: str
    default: str
    meaning: str


def add_settings(parser: argparse.ArgumentParser, cls: type[Settings]) -> None:
    """Add a flag for every setting of ``cls`` (and of its groups) that has one."""
    for dest, item in walk(cls):
        spec = item.spec
        if spec is None or spec.flag is None:
            continue
        metavar = spec.metavar or spec.flag.removeprefix("--").replace("-", "_").upper()
        kwargs: dict[str, Any] = {"dest": dest, "default": None, "help": _help(item)}
        if item.base is bool:
            kwargs |= {"action": "store_const", "const": "true"}
        elif spec.many:
            kwargs |= {"action": "append", "metavar": metavar}
        else:
            choices = item.choices
            kwargs |= {"choices": choices} if choices else {"metavar": metavar}
        parser.add_argument(spec.flag, **kwargs)


def parse_settings(
    parser: argparse.ArgumentParser, cls: type[C], argv: Sequence[str] | None = None
) -> C:
    """Parse ``argv`` into a checked ``cls``; a bad flag or variable exits with usage (2)."""
    args = parser.parse_args(argv)
    try:
        return settings_from_args(cls, args)
    except ValueError as exc:
        parser.error(str(exc))


def settings_from_args(
    cls: type[C],
    args: argparse.Namespace,
    prefix: str = "",
    environ: Mapping[str, str] | None = None,
) -> C:
    """Build ``cls`` from parsed flags, then variables (``os.environ`` unless ``environ``),
    then defaults (raises ValueError)."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for item in declared(cls):
        if item.spec is None:
            continue
        found = _text(item, getattr(args, prefix + item.name, None), env)
        if found is not None:
            values[item.name] = _value(item, *found)
        elif item.required:
            raise ValueError(f"{item.spec.label} is required")
    for name, group in groups(cls):
        values[name] = settings_from_args(group, args, f"{prefix}{name}.", env)
    return cls(**values)


def settings_from_env(cls: type[C], environ: Mapping[str, str] | None = None) -> C:
    """Build ``cls`` from its variables and defaults alone, as if no flag were given."""
    return settings_from_args(cls, argparse.Namespace(), environ=environ)


def setting_rows(cls: type[Settings]) -> Iterator[SettingRow]:
    """The README row of every setting of ``cls`` and of its groups, in declaration order."""
    for _, item in walk(cls):
        spec = item.spec
        if spec is None or (spec.env is None and spec.flag is None):
            continue
        shown = shown_default(item)
        if item.base is bool and item.default is False:
            shown = "off"
        default = "required" if item.required else "unset" if shown is None else f"`{shown}`"
        file = f"Or `{spec.env}_FILE`: a file that holds it." if spec.secret and spec.env else ""
        meaning = " ".join(part for part in (_sentence(spec.help), spec.more, file) if part)
        flag = f"`{spec.flag}`" if spec.flag else ""
        yield SettingRow(f"`{spec.env}`" if spec.env else "", flag, default, meaning)


def _text(item: Declared, flagged: Any, env: Mapping[str, str]) -> tuple[Any, str] | None:
    """The text to parse and where it came from: the flag, else the variable, else the
    shown default of a setting with its own ``parse``."""
    spec = item.spec
    assert spec is not None
    if flagged is not None:
        return flagged, spec.flag or ""
    raw = env.get(spec.env) if spec.env else None
    if raw and raw.strip():
        return raw, spec.env or ""
    if spec.secret and spec.env and env.get(f"{spec.env}_FILE"):
        return _read_secret(f"{spec.env}_FILE", env[f"{spec.env}_FILE"])
    if spec.parse is not None and spec.shown is not None:
        return spec.shown, "default"
    return None


def _read_secret(variable: str, named: str) -> tuple[str, str]:
    """The text of the file ``named`` (by ``variable``), without its trailing newline."""
    path = Path(named)
    try:
        return path.read_text().strip(), variable
    except OSError as exc:
        raise ValueError(f"{variable}={str(path)!r}: cannot read it ({exc.strerror})") from None


def _value(item: Declared, text: Any, source: str) -> Any:
    spec = item.spec
    assert spec is not None
    choices = item.choices
    if choices is not None and text not in choices:
        raise ValueError(f"{_where(spec.flag, spec.env, source, text)}: choose from {choices}")
    try:
        if spec.parse is not None:
            return spec.parse(text)
        if item.base is bool:
            return _bool(text)
        return msgspec.convert(text, item.base, strict=False)
    except (ValueError, msgspec.ValidationError) as exc:
        raise ValueError(f"{_where(spec.flag, spec.env, source, text)}: {exc}") from None


def _bool(text: Any) -> bool:
    word = str(text).strip().lower()
    if word not in _TRUE | _FALSE:
        raise ValueError(f"must be true or false ({', '.join(sorted(_TRUE | _FALSE))})")
    return word in _TRUE


def _where(flag: str | None, env: str | None, source: str, text: Any) -> str:
    if source == env and flag:
        return f"{env}={text!r} is not a valid {flag}"
    return f"{source}={text!r} is not valid"


def _help(item: Declared) -> str:
    spec = item.spec
    assert spec is not None
    parts = [spec.help.replace("%", "%%")]
    if spec.env:
        parts.append(f"(env {spec.env})")
    shown = shown_default(item)
    if shown is not None:
        parts.append(f"(default: {shown})".replace("%", "%%"))
    return " ".join(parts)


def _sentence(text: str) -> str:
    """``help`` as the README's sentence: it keeps its case (flags and names start lower)."""
    text = text.strip()
    return text if text.endswith(".") else f"{text}."
