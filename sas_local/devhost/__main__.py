"""Command line of ``python -m sas_local.devhost``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from sas_local.devhost import logs
from sas_local.devhost.config import EXIT_CONFIG, DevHostError, load_settings
from sas_local.devhost.pool import WorkerPool


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError("port must be 0..65535")
    return port


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sas_local.devhost",
        description="Run a Functions v2 app's queue, timer and HTTP triggers against Azurite.",
    )
    p.add_argument("--app", type=Path, default=Path("function_app.py"), help="default: %(default)s")
    p.add_argument("--workers", type=_positive, default=1, help="worker processes (default 1)")
    p.add_argument(
        "--http-port", type=_port, default=7071, help="HTTP port on 127.0.0.1; 0 = no HTTP"
    )
    p.add_argument("--functions", default="", help="comma-separated function names (default all)")
    p.add_argument("--no-timers", action="store_true", help="do not run timer triggers")
    p.add_argument(
        "--settings",
        type=Path,
        default=None,
        help="local.settings.json (default: next to the app; environment variables win)",
    )
    p.add_argument("--grace", type=float, default=10.0, help="shutdown grace in seconds (10)")
    p.add_argument("--log-level", default="INFO", help="INFO (default), DEBUG, WARNING...")
    p.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    return p


def _functions(text: str) -> tuple[str, ...] | None:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    return names or None


def _worker_argv(args: argparse.Namespace, app: Path, index: int, ready_fd: int) -> list[str]:
    argv = [sys.executable, "-m", "sas_local.devhost", "--app", str(app)]
    argv += ["--http-port", str(args.http_port), "--grace", str(args.grace)]
    argv += ["--log-level", args.log_level, "--worker-index", str(index)]
    argv += ["--ready-fd", str(ready_fd)]
    if args.functions:
        argv += ["--functions", args.functions]
    if args.no_timers:
        argv.append("--no-timers")
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    app = args.app.resolve()
    if args.worker_index is not None:
        # Only a worker loads the app's machinery: the parent stays at a tenth of the CPU.
        from sas_local.devhost.worker import WorkerOptions, worker_main

        worker_main(
            WorkerOptions(
                app=app,
                index=args.worker_index,
                http_port=args.http_port,
                functions=_functions(args.functions),
                timers=not args.no_timers,
                grace=args.grace,
                log_level=args.log_level,
                ready_fd=args.ready_fd,
            )
        )
    logs.configure(args.log_level, f"host {os.getpid()}", app=False)
    try:
        if not app.is_file():
            raise DevHostError(f"function app {app} does not exist (use --app PATH)")
        explicit = args.settings is not None
        settings_path = args.settings if explicit else app.parent / "local.settings.json"
        env = load_settings(settings_path, os.environ, explicit=explicit)
    except DevHostError as exc:
        print(f"sas.devhost: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    path = env.get("PYTHONPATH", "")
    package_root = Path(__file__).parents[2]  # the directory that holds `sas` and `sas_local`
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_root), path) if p)

    def command(index: int, ready_fd: int) -> list[str]:
        return _worker_argv(args, app, index, ready_fd)

    return WorkerPool(command, args.workers, env, args.grace).run()


if __name__ == "__main__":
    raise SystemExit(main())
