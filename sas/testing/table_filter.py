"""The OData filters an app's actions give ``TableClient.query_entities``, evaluated in memory
(``InMemoryTable``): comparisons (``eq ne gt ge lt le``) of a property with a literal or an
``@parameter``, joined by ``and``, ``or``, ``not`` and parentheses. Literals: ``'text'`` (a
quote doubled inside), numbers (``L`` for Int64), ``true``/``false``, ``datetime'...'`` and
``guid'...'``. As the service does, a comparison with a property the entity lacks, or of
another type, is false. Anything else is a ``ValueError`` naming it."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

Predicate = Callable[[Mapping[str, Any]], bool]

_TOKEN = re.compile(
    r"\s*(?:"
    r"(?P<typed>(?:datetime|guid)'[^']*')"
    r"|(?P<string>'(?:[^']|'')*')"
    r"|(?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[Ll]?)"
    r"|(?P<param>@[A-Za-z_]\w*)"
    r"|(?P<word>[A-Za-z_]\w*)"
    r"|(?P<paren>[()])"
    r")"
)
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "gt": operator.gt,
    "ge": operator.ge,
    "lt": operator.lt,
    "le": operator.le,
}


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str


def compile_filter(query: str, parameters: Mapping[str, Any] | None = None) -> Predicate:
    """A predicate on an entity for the filter ``query``; ValueError if it is not one."""
    parser = _Parser(_tokens(query), dict(parameters or {}), query)
    predicate = parser.expression()
    left_over = parser.peek()
    if left_over is not None:
        raise ValueError(f"filter {query!r}: unexpected {left_over.text!r}")
    return predicate


def _tokens(query: str) -> list[_Token]:
    found: list[_Token] = []
    position = 0
    while position < len(query.rstrip()):
        match = _TOKEN.match(query, position)
        if match is None or match.end() == position:
            raise ValueError(f"filter {query!r}: cannot read it from {query[position:]!r}")
        kind = match.lastgroup or ""
        found.append(_Token(kind, match.group(kind)))
        position = match.end()
    return found


class _Parser:
    def __init__(self, tokens: list[_Token], parameters: dict[str, Any], query: str) -> None:
        self._tokens = tokens
        self._at = 0
        self._parameters = parameters
        self._query = query

    def peek(self) -> _Token | None:
        return self._tokens[self._at] if self._at < len(self._tokens) else None

    def _take(self) -> _Token:
        token = self.peek()
        if token is None:
            raise ValueError(f"filter {self._query!r} ends too soon")
        self._at += 1
        return token

    def _keyword(self, word: str) -> bool:
        token = self.peek()
        if token is not None and token.kind == "word" and token.text.lower() == word:
            self._at += 1
            return True
        return False

    def expression(self) -> Predicate:
        left = self._conjunction()
        while self._keyword("or"):
            right = self._conjunction()
            left = _either(left, right)
        return left

    def _conjunction(self) -> Predicate:
        left = self._negation()
        while self._keyword("and"):
            right = self._negation()
            left = _both(left, right)
        return left

    def _negation(self) -> Predicate:
        if self._keyword("not"):
            inner = self._negation()
            return lambda entity: not inner(entity)
        token = self.peek()
        if token is not None and token.text == "(":
            self._take()
            inner = self.expression()
            if self._take().text != ")":
                raise ValueError(f"filter {self._query!r}: a parenthesis is not closed")
            return inner
        return self._comparison()

    def _comparison(self) -> Predicate:
        name = self._take()
        if name.kind != "word":
            raise ValueError(f"filter {self._query!r}: expected a property, got {name.text!r}")
        verb = self._take().text.lower()
        if verb not in _COMPARE:
            raise ValueError(f"filter {self._query!r}: {verb!r} is not a comparison")
        return _compare(name.text, _COMPARE[verb], self._literal())

    def _literal(self) -> Any:
        token = self._take()
        if token.kind == "param":
            try:
                return self._parameters[token.text[1:]]
            except KeyError:
                raise ValueError(f"filter {self._query!r}: no parameter {token.text}") from None
        return _value(token, self._query)


def _value(token: _Token, query: str) -> Any:
    text = token.text
    if token.kind == "string":
        return text[1:-1].replace("''", "'")
    if token.kind == "number":
        digits = text.rstrip("Ll")
        return float(digits) if any(c in digits for c in ".eE") else int(digits)
    if token.kind == "typed":
        kind, _, quoted = text.partition("'")
        raw = quoted[:-1]
        if kind == "guid":
            return UUID(raw)
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    if token.kind == "word" and text in ("true", "false"):
        return text == "true"
    raise ValueError(f"filter {query!r}: expected a value, got {text!r}")


def _kind(value: Any) -> type:
    """The type a comparison must share (an int and a float are both numbers)."""
    if isinstance(value, bool):
        return bool
    if isinstance(value, int | float):
        return float
    if isinstance(value, datetime):
        return datetime
    return type(value)


def _comparable(value: Any) -> Any:
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _compare(name: str, compare: Callable[[Any, Any], bool], literal: Any) -> Predicate:
    def test(entity: Mapping[str, Any]) -> bool:
        if name not in entity or entity[name] is None:
            return False
        value = entity[name]
        if _kind(value) is not _kind(literal):
            return False
        return compare(_comparable(value), _comparable(literal))

    return test


def _either(left: Predicate, right: Predicate) -> Predicate:
    return lambda entity: left(entity) or right(entity)


def _both(left: Predicate, right: Predicate) -> Predicate:
    return lambda entity: left(entity) and right(entity)
