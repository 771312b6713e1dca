"""A PostgreSQL server of the tests' own: Debian's PostgreSQL binaries, a new cluster in a
temporary directory, on a free loopback port, with a password (scram-sha-256), stopped and
removed after."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from circuits.daemon import free_port

USER = "dbsp"
PASSWORD = "dbsp-test-password"


@dataclass(frozen=True)
class Postgres:
    port: int
    database: str
    user: str = USER
    password: str = PASSWORD
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"


def _binaries() -> str:
    """The newest installed PostgreSQL's ``bin`` directory (Debian keeps them off PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("no PostgreSQL server installed: apt-get install postgresql (as .ci/run does)")
    return os.path.dirname(found[-1])


def _as_server_user(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, the command runs as Debian's ``postgres``."""
    if os.geteuid() != 0:
        return command
    # Debian keeps runuser in /usr/sbin, which a stripped PATH (env -i, cron) leaves out.
    runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
    if runuser is None:
        raise RuntimeError("runuser not found on PATH or in /usr/sbin: apt-get install util-linux")
    return [runuser, "-u", "postgres", "--", *command]


@contextmanager
def postgres_server(database: str = "dagster") -> Iterator[Postgres]:
    binaries, port = _binaries(), free_port()
    # Not under pytest's tmp_path: a root-owned 0700 tree the server's user cannot enter.
    base = tempfile.mkdtemp(prefix="dbsp-postgres-")
    data, password_file = os.path.join(base, "data"), os.path.join(base, "password")
    with open(password_file, "w") as f:
        f.write(PASSWORD)
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(base, user.pw_uid, user.pw_gid)
        os.chown(password_file, user.pw_uid, user.pw_gid)

    def run(*command: str) -> None:
        subprocess.run(
            _as_server_user([os.path.join(binaries, command[0]), *command[1:]]), check=True, capture_output=True
        )

    try:
        run("initdb", "-D", data, "-U", USER, "--auth=scram-sha-256", f"--pwfile={password_file}", "-E", "UTF8")
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
        run("pg_ctl", "-D", data, "-l", os.path.join(base, "server.log"), "-o", options, "-w", "start")
        server = Postgres(port, database)
        env = {**os.environ, "PGPASSWORD": PASSWORD}
        subprocess.run(
            ["createdb", "-h", server.host, "-p", str(port), "-U", USER, database],
            check=True,
            capture_output=True,
            env=env,
        )
        yield server
    finally:
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            run("pg_ctl", "-D", data, "-m", "immediate", "stop")
        shutil.rmtree(base, ignore_errors=True)
