"""A throwaway PostgreSQL server for tests and CI: its own user, a temporary data folder, loopback, a free port.

Used by ``tests/test_tune_postgres.py`` (``tune.storage=postgresql://...``) and usable by hand::

    python -m pacectl.testing.postgres      # starts one, prints its URL, stops it on Enter

Needs the server binaries (Debian: ``apt-get install postgresql``; found on ``PATH`` or in
``/usr/lib/postgresql/<version>/bin``) and ``psycopg2`` (``pip install -e ".[rdb]"``). As root the
server runs as the ``postgres`` user (PostgreSQL refuses to run as root); otherwise as the caller.
:func:`missing` says why a server cannot be started here, for a clean ``pytest.skip``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(Path(p).parts[4]))
    return versions[-1] if versions else None


def _run_as() -> pwd.struct_passwd | None:
    """The user the server runs as: ``postgres`` when we are root, else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        return None


def missing() -> str | None:
    """Why no server can be started here, or None."""
    for name in ("initdb", "pg_ctl"):
        if _bin(name) is None:
            return f"PostgreSQL's {name} is not installed (Debian: apt-get install postgresql)"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return 'psycopg2 is not installed (pip install -e ".[rdb]")'
    if os.geteuid() == 0 and _run_as() is None:
        return "running as root and there is no postgres user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def postgres_server(db: str = "pacectl") -> Iterator[str]:
    """Start a server, create database ``db``, yield its SQLAlchemy URL; stop and delete it after.

    Raises:
        RuntimeError: :func:`missing` names a reason, or the server did not start (its log's tail).
    """
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    user = _run_as()
    root = Path(tempfile.mkdtemp(prefix="pacectl-pg-"))
    data, log = root / "data", root / "server.log"

    def as_user() -> None:
        if user is not None:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)

    if user is not None:
        os.chown(root, user.pw_uid, user.pw_gid)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"LC_ALL": "C"}
    port = _free_port()
    started = False
    try:
        subprocess.run(
            [_bin("initdb"), "-D", str(data), "-U", "pacectl", "--auth=trust", "-E", "UTF8", "--no-instructions"],
            preexec_fn=as_user, env=env, check=True, capture_output=True, cwd=root,
        )  # fmt: skip
        proc = subprocess.run(
            [
                _bin("pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "start", "-o",
                f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off",
            ],
            preexec_fn=as_user, env=env, capture_output=True, text=True, cwd=root,
        )  # fmt: skip
        if proc.returncode != 0:
            tail = log.read_text()[-800:] if log.exists() else proc.stderr[-800:]
            raise RuntimeError(f"PostgreSQL did not start on port {port}: {tail}")
        started = True
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=port, user="pacectl", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{db}"')
        conn.close()
        yield f"postgresql+psycopg2://pacectl@127.0.0.1:{port}/{db}"
    finally:
        if started:
            subprocess.run(
                [_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                preexec_fn=as_user, env=env, capture_output=True, cwd=root,
            )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    with postgres_server() as url:
        print(url, flush=True)
        try:
            input("PostgreSQL is running; press Enter to stop it\n")
        except EOFError:
            pass
