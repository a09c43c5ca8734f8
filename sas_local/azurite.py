"""Start and stop Azurite (tables, queues, blobs) on free loopback ports.

Data lives on disk (``--location``), never ``--inMemoryPersistence``: Azurite's in-memory
queue garbage collection freezes the queue service under load (see shared facts).
The account key below is Azurite's public, documented development key, not a secret.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from sas_cli.appsettings import AZURITE_ACCOUNT, AZURITE_KEY
from sas_local.processes import REPO_ROOT, ManagedProcess, start_process

log = logging.getLogger(__name__)

ACCOUNT = AZURITE_ACCOUNT
DEV_KEY = AZURITE_KEY


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def connection_string(blob_port: int, queue_port: int, table_port: int) -> str:
    base = "http://127.0.0.1"
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={DEV_KEY};"
        f"BlobEndpoint={base}:{blob_port}/{ACCOUNT};QueueEndpoint={base}:{queue_port}/{ACCOUNT};"
        f"TableEndpoint={base}:{table_port}/{ACCOUNT};"
    )


def azurite_executable() -> str:
    local = REPO_ROOT / "node_modules" / ".bin" / "azurite"
    if local.exists():
        return str(local)
    found = shutil.which("azurite")
    if found is None:
        raise FileNotFoundError("azurite not found: run `npm ci` in the repository root")
    return found


@dataclass
class Azurite:
    """A running Azurite; use as a context manager or call stop()."""

    blob_port: int
    queue_port: int
    table_port: int
    location: Path
    process: ManagedProcess
    _owns_location: bool = field(default=False, repr=False)

    @property
    def connection_string(self) -> str:
        return connection_string(self.blob_port, self.queue_port, self.table_port)

    @classmethod
    def start(cls, location: Path | None = None, timeout: float = 30.0) -> Azurite:
        owns = location is None
        if location is None:
            shm = Path("/dev/shm")  # noqa: S108 - RAM-backed and private to this run (mkdtemp)
            location = Path(
                tempfile.mkdtemp(prefix="sas-azurite-", dir=shm if shm.is_dir() else None)
            )
        location.mkdir(parents=True, exist_ok=True)
        ports = free_port(), free_port(), free_port()
        args = [
            azurite_executable(),
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
            "--location", str(location),
            "--blobHost", "127.0.0.1", "--blobPort", str(ports[0]),
            "--queueHost", "127.0.0.1", "--queuePort", str(ports[1]),
            "--tableHost", "127.0.0.1", "--tablePort", str(ports[2]),
        ]  # fmt: skip
        process = start_process(args, log_dir=location / "logs")
        azurite = cls(*ports, location=location, process=process, _owns_location=owns)
        try:
            for port in ports:
                process.wait_for_port(port, timeout=timeout)
        except BaseException:
            azurite.stop()
            raise
        log.info("sas.azurite_started", extra={"ports": ports, "location": str(location)})
        return azurite

    def stop(self) -> None:
        self.process.stop(grace=10)
        if self._owns_location:
            shutil.rmtree(self.location, ignore_errors=True)

    def __enter__(self) -> Azurite:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main() -> None:
    """`python -m sas_local.azurite`: run Azurite, print its connection string."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--location", type=Path, default=None)
    args = parser.parse_args()
    azurite = Azurite.start(args.location)
    print(azurite.connection_string, flush=True)
    stop = {"now": False}

    def handle(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    try:
        while not stop["now"] and azurite.process.poll() is None:
            time.sleep(0.2)
    finally:
        azurite.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
