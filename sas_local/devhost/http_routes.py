"""HTTP route templates as the Functions host reads them: ``{name}``, ``{id:int}``, ``{x?}``,
``{*rest}``, under host.json ``extensions.http.routePrefix``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from sas_local.devhost.config import DevHostError
from sas_local.devhost.loader import HttpFunction

_PARAMETER = re.compile(r"\{([^{}]+)\}")
_CONSTRAINTS = {
    "int": r"-?\d+",
    "long": r"-?\d+",
    "alpha": r"[A-Za-z]+",
    "bool": r"(?i:true|false)",
    "guid": r"[0-9A-Fa-f]{8}-?(?:[0-9A-Fa-f]{4}-?){3}[0-9A-Fa-f]{12}",
}


@dataclass(frozen=True)
class Route:
    function: HttpFunction
    pattern: re.Pattern[str]
    catch_all: bool
    literal_segments: int

    def match(self, path: str) -> dict[str, str] | None:
        found = self.pattern.match(path)
        if found is None:
            return None
        return {
            key: unquote(value) for key, value in found.groupdict().items() if value is not None
        }


def _segment(segment: str, last: bool, function: str) -> tuple[str, bool, bool]:
    """Regex for one path segment (with its leading slash); (regex, is_literal, is_catch_all)."""
    whole = _PARAMETER.fullmatch(segment)
    if whole is not None:
        spec = whole.group(1)
        if spec.startswith("*"):
            if not last:
                raise DevHostError(f"function {function!r}: catch-all {{{spec}}} must come last")
            name = spec[1:].split(":")[0].split("=")[0].rstrip("?")
            return rf"(?:/(?P<{name}>.*))?", False, True
        name, pattern, optional = _parameter(spec)
        if optional:
            return rf"(?:/(?P<{name}>{pattern}))?", False, False
        return rf"/(?P<{name}>{pattern})", False, False
    parts: list[str] = []
    position = 0
    literal = True
    for match in _PARAMETER.finditer(segment):
        parts.append(re.escape(segment[position : match.start()]))
        name, pattern, _ = _parameter(match.group(1))
        parts.append(rf"(?P<{name}>{pattern})")
        position = match.end()
        literal = False
    parts.append(re.escape(segment[position:]))
    return "/" + "".join(parts), literal, False


def _parameter(spec: str) -> tuple[str, str, bool]:
    optional = spec.endswith("?")
    spec = spec.rstrip("?").split("=")[0]
    name, _, constraint = spec.partition(":")
    pattern = _CONSTRAINTS.get(constraint.split("(")[0].lower(), r"[^/]+")
    return name, pattern, optional


def compile_route(function: HttpFunction, prefix: str) -> Route:
    template = "/".join(part for part in (prefix.strip("/"), function.route.strip("/")) if part)
    segments = [segment for segment in template.split("/") if segment]
    regex: list[str] = []
    literals = 0
    catch_all = False
    for index, segment in enumerate(segments):
        part, literal, is_catch_all = _segment(segment, index == len(segments) - 1, function.name)
        regex.append(part)
        literals += literal
        catch_all = catch_all or is_catch_all
    pattern = re.compile("^" + "".join(regex) + "/?$", re.IGNORECASE)
    return Route(function, pattern, catch_all, literals)


def compile_routes(functions: tuple[HttpFunction, ...], prefix: str) -> list[Route]:
    """Most specific first: catch-alls last, then by literal segments."""
    routes = [compile_route(function, prefix) for function in functions]
    return sorted(routes, key=lambda route: (route.catch_all, -route.literal_segments))
