"""A throwaway PostgreSQL server for benches and tests (tests/conftest.py's `server` fixture), started as
.ci/run starts one: Debian's `postgresql` binaries, `initdb` into a folder of its own (as the `postgres`
user when run as root), on 127.0.0.1 and a free port, stopped and removed on exit."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path


class NoServer(Exception):
    """No PostgreSQL server can be started here; the message says why."""


@dataclass
class Server:
    url: str  # of the maintenance database `postgres`
    pgdata: str | None = None  # set when the caller may restart the server
    as_owner: list[str] = field(default_factory=list)  # prefix that runs pg_ctl as the data directory's owner

    def database(self) -> str:
        """A new, empty database; its URL."""
        import psycopg
        import sqlalchemy

        name = f"d_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return str(sqlalchemy.engine.make_url(self.url).set(database=name).render_as_string(hide_password=False))

    def restart(self) -> None:
        """Restart the server; its output goes to a log file (a pipe would be held open by the new server)."""
        log = Path(self.pgdata).parent / "restart.log"
        subprocess.run([*self.as_owner, _bin("pg_ctl"), "-D", self.pgdata, "-l", str(log), "-m", "fast", "-w", "restart"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise NoServer(f"{name} not found (Debian: apt-get install postgresql)")
    return found


@contextlib.contextmanager
def throwaway_postgres(password: str = "explorer-throwaway") -> Iterator[Server]:
    """A server of its own for the `with` block; NoServer where none can start."""
    as_owner: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root: the cluster belongs to the `postgres` user
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            raise NoServer("running as root and there is no `postgres` user") from None
        as_owner = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="explorer-pg-"))  # short (the server's socket lives here), its own: `postgres` owns it
    secret, data = root / "password", root / "data"
    secret.write_text(password + "\n")
    if as_owner:
        os.chown(root, user.pw_uid, user.pw_gid)
        shutil.chown(secret, "postgres", "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        for cmd in ([*as_owner, _bin("initdb"), "-D", str(data), "-U", "explorer", f"--pwfile={secret}", "--auth=scram-sha-256"],
                    [*as_owner, _bin("pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w",
                     "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {root}", "start"]):
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise NoServer(done.stderr.strip()[-300:])
    except NoServer:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        yield Server(f"postgresql://explorer:{password}@127.0.0.1:{port}/postgres", str(data), as_owner)
    finally:
        subprocess.run([*as_owner, _bin("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
