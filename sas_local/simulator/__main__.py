"""`python -m sas_local.simulator`: serve the simulator, with faults set from flags at start."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from sas.domain.wire import STEP_NAME
from sas_local.simulator.faults import FaultConfig

# flag -> FaultConfig field; only flags actually given override --faults-json.
_FAULT_FLAGS: dict[str, tuple[type, str]] = {
    "seed": (int, "seed of the fault dice (same seed, same faults per key)"),
    "transient_rate": (float, "share of calls answered 503/429, nothing applied"),
    "throttle_share": (float, "share of the transient failures answered 429 Retry-After: 1"),
    "permanent_rate": (float, "share of do-keys refused for good (402/422), stable per key"),
    "undo_permanent_rate": (float, "share of undo-keys refused for good (default 0)"),
    "slow_rate": (float, "share of successful calls answered slow_seconds late"),
    "slow_seconds": (float, "delay of a slow answer, after the effect is applied"),
    "outage_service": (str, "service answering 503 to everything during the outage window"),
    "outage_start": (float, "seconds after start when the outage begins"),
    "outage_seconds": (float, "length of the outage window"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Simulated remote service for sas")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7081)
    parser.add_argument(
        "--services",
        type=_services,
        default=None,
        help="comma-separated services it plays, others answered 404 (default: the app's "
        "HTTP agents, those local.settings.example.json points at it)",
    )
    parser.add_argument(
        "--faults-json",
        help="a whole fault config as JSON (as PUT /faults takes, per_service included)",
    )
    for name, (kind, text) in _FAULT_FLAGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, help=text)
    return parser


def _services(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    wrong = [name for name in names if not STEP_NAME.matches(name)]
    if wrong:
        raise argparse.ArgumentTypeError(f"not a service name: {', '.join(wrong)}")
    return names


def played(args: argparse.Namespace) -> tuple[str, ...]:
    """The services to play: those named, else the app's HTTP agents (its declared workflows,
    read only then)."""
    if args.services is not None:
        return tuple(args.services)
    from sas.settings import HTTP_AGENTS

    return HTTP_AGENTS


def faults_from_args(args: argparse.Namespace) -> FaultConfig:
    """The config: --faults-json first, then each explicit flag over it. ValueError if invalid."""
    raw: dict[str, Any] = json.loads(args.faults_json) if args.faults_json else {}
    if not isinstance(raw, dict):
        raise ValueError("--faults-json must be a JSON object")
    raw |= {name: getattr(args, name) for name in _FAULT_FLAGS if getattr(args, name) is not None}
    try:
        return FaultConfig.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn

    from sas_local.simulator.app import create_app

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        faults = faults_from_args(args)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError too
        parser.error(f"invalid faults: {exc}")
    app = create_app(faults, services=played(args))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
