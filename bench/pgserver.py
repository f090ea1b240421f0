"""A throwaway PostgreSQL server for benches, started as .ci/run and tests/conftest.py start one: Debian's
`postgresql` binaries, `initdb` into a folder of its own (as the `postgres` user when run as root), on
127.0.0.1 and a free port, stopped and removed on exit."""

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
from dataclasses import dataclass
from glob import glob
from pathlib import Path


@dataclass
class Server:
    url: str  # of the maintenance database `postgres`

    def database(self) -> str:
        """A new, empty database; its URL."""
        import psycopg
        import sqlalchemy

        name = f"b_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return str(sqlalchemy.engine.make_url(self.url).set(database=name).render_as_string(hide_password=False))


def _bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise SystemExit(f"no PostgreSQL here: {name} not found (Debian: apt-get install postgresql), or pass --postgres URL")
    return found


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[Server]:
    root = Path(tempfile.mkdtemp(prefix="explorer-pg-"))  # short (the server's socket lives here), its own: `postgres` owns it
    as_owner: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_owner = ["runuser", "-u", "postgres", "--"]
    secret = root / "password"
    secret.write_text("explorer-bench\n")
    if as_owner:
        shutil.chown(secret, "postgres", "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = root / "data"
    for cmd in ([*as_owner, _bin("initdb"), "-D", str(data), "-U", "explorer", f"--pwfile={secret}", "--auth=scram-sha-256"],
                [*as_owner, _bin("pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w",
                 "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {root}", "start"]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            shutil.rmtree(root, ignore_errors=True)
            raise SystemExit(f"no PostgreSQL server started here ({done.stderr.strip()[-300:]}); pass --postgres URL")
    try:
        yield Server(f"postgresql://explorer:explorer-bench@127.0.0.1:{port}/postgres")
    finally:
        subprocess.run([*as_owner, _bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
