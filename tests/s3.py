"""An S3-compatible server of the tests' own: moto's server mode (from PyPI), on a free
loopback port, in a process of its own.  moto implements S3's conditional writes as S3
does (``If-None-Match: *`` and ``If-Match: <etag>`` on PutObject, refused with 412
Precondition Failed), which Delta's commits on S3 rest on
(``tests/storage/test_object_store.py`` races them)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from circuits.daemon import free_port, listening
from storage.location import ObjectStore, reach_store

ACCESS_KEY, SECRET_KEY, REGION = "dbsp-test", "dbsp-test-secret", "us-east-1"


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def store(self) -> ObjectStore:
        return ObjectStore(self.endpoint, REGION, ACCESS_KEY, SECRET_KEY)

    def reach(self, root: str) -> None:
        """Makes this process reach ``root`` (``s3://bucket/...``) on this server."""
        reach_store(root, self.store())

    def bucket(self) -> str:
        """A new, empty bucket."""
        name = f"dbsp-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def delta_options(self) -> dict[str, str]:
        """delta-rs's storage options for this server, committing by conditional put."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
            "conditional_put": "etag",
        }


@contextmanager
def s3_server(timeout: float = 60.0, env: dict[str, str] | None = None) -> Iterator[S3Server]:
    """The server, on a free port; ``env`` adds to its environment (moto's settings)."""
    port = free_port()
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}
    )
    try:
        deadline = time.monotonic() + timeout
        while not listening(port, timeout=0.5):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's S3 server did not listen on 127.0.0.1:{port} (exit code {process.poll()})")
            time.sleep(0.1)
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        process.terminate()
        process.wait(timeout=30)
