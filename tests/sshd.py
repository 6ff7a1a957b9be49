"""A real OpenSSH sshd on 127.0.0.1 for tests, with throw-away keys made per test run.

`Sshd(directory)` writes host keys, a client key, authorized_keys, known_hosts and an
sshd_config into `directory` and starts `sshd -D -e` on a free port. `stop()` takes the
server down together with every connection it serves (as when a host goes away);
`start()` brings it back on the same port with the same keys; `sever()` kills only the
processes serving current connections, so clients see a dropped connection while the
listener stays up.

Commands run over it find the project's venv first on PATH (`trackside`, `python`), and
`sshd.python` is the venv's interpreter by absolute path.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def sshd_available() -> bool:
    return os.access(SSHD, os.X_OK) and shutil.which("ssh-keygen") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name may contain spaces and parentheses; fields resume after the last ')'.
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _descendants(pid: int) -> list[int]:
    out = []
    for child in _children(pid):
        out.append(child)
        out.extend(_descendants(child))
    return out


class Sshd:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.address = "127.0.0.1"
        self.user = os.environ.get("USER") or "root"
        self.host_key = self.dir / "ssh_host_ed25519_key"
        self.client_key = self.dir / "client_key"
        self.known_hosts = self.dir / "known_hosts"
        self.config = self.dir / "sshd_config"
        self.log = self.dir / "sshd.log"
        self.python = VENV_BIN / "python"
        self._proc: subprocess.Popen | None = None
        self._write_files()

    def _write_files(self) -> None:
        _keygen(self.host_key, "trackside-test-host")
        _keygen(self.client_key, "trackside-test-client")
        (self.dir / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        host_pub = Path(f"{self.host_key}.pub").read_text().split()
        self.known_hosts.write_text(f"[{self.address}]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        path = os.pathsep.join([str(VENV_BIN), "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
        # bash sources ~/.bashrc for SSH commands only at shell level 1. Root's .bashrc here
        # runs `pyenv init`, whose rehash lock, left stale by a login the tests cut short,
        # makes every later login wait 60 s; SHLVL=1 keeps the tests' logins out of it.
        self.config.write_text(
            f"""\
ListenAddress {self.address}
Port {self.port}
HostKey {self.host_key}
PidFile {self.dir / "sshd.pid"}
AuthorizedKeysFile {self.dir / "authorized_keys"}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
SetEnv PATH={path} SHLVL=1
LogLevel INFO
"""
        )

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        if self.running:
            return
        # sshd refuses to start without its privilege-separation directory.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config)],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self._proc.returncode}:\n{self.log.read_text()}")
            try:
                with socket.create_connection((self.address, self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"sshd did not answer on port {self.port} within {timeout}s:\n{self.log.read_text()}")

    def sever(self) -> int:
        """Kill the processes serving current connections; returns how many were killed."""
        if not self.running:
            return 0
        victims = _descendants(self._proc.pid)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(victims)

    def stop(self) -> None:
        if not self.running:
            return
        self.sever()
        self._proc.terminate()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def host(self, name: str = "sshd", **kwargs):
        """An SSHHost pointed at this server; keyword arguments override the defaults."""
        from backends.hosts import SSHHost

        options = dict(
            user=self.user,
            port=self.port,
            known_hosts=str(self.known_hosts),
            client_keys=[str(self.client_key)],
            connect_timeout=5.0,
        )
        options.update(kwargs)
        return SSHHost(name, self.address, **options)


if __name__ == "__main__":
    # Manual use: `python tests/sshd.py DIR` runs a server until interrupted.
    server = Sshd(Path(sys.argv[1]))
    server.start()
    print(f"ssh -p {server.port} -i {server.client_key} -o UserKnownHostsFile={server.known_hosts} {server.user}@127.0.0.1")
    try:
        signal.pause()
    finally:
        server.stop()
