"""The configuration file: which hosts to supervise, and defaults for launches.

`~/.config/trackside/config.toml` (or `--config PATH`):

    [defaults]
    grace_s = 30            # kill: seconds between SIGTERM and SIGKILL
    poll_ms = 1000          # dashboard refresh
    runs_root = "~/.trackside/runs"

    [hosts.bastion]
    address = "bastion.example.org"

    [hosts.gpu1]
    address = "10.0.0.5"    # omitted: this machine
    user = "root"
    port = 22
    jump = "bastion"        # another host of this file
    prefix = "pct exec 129 --"      # or ["pct", "exec", "129", "--"]
    train_command = ["trackside", "train"]
    nvidia_smi = "nvidia-smi"
    known_hosts = "~/.ssh/known_hosts"
    identity_file = "~/.ssh/id_ed25519"
    max_channels = 8        # SSH channels at once; streams take all but 2
    ship = true             # launch/relaunch send the local training package (--no-ship: not)
    ship_from = "~/src/trackside/training"   # that package (default: this trackside's)
    python = "/opt/venv/bin/python"          # what runs it there (default python3; needs torch)
    record = true           # the GPU recorder runs on the host (false: never started here)

    [[hosts.gpu1.sync]]     # a directory sent before a shipping launch or relaunch
    from = "~/work/dflash"  # here
    to = "/root/dflash"     # on the host (inside its prefix)
    exclude = [".git", "checkpoints", "data"]   # names never sent nor touched (this default
    max_mib = 64            # and __pycache__, *.pyc); the most it may hold after excludes

    [alerts]
    command = ["curl", "-sS", "--data-binary", "@-", "https://hooks.example.org/x"]
    timeout_s = 10          # the command is killed after this long
    stall_floor_s = 300     # no step for 10x the step time, never sooner than this
    underfed_s = 60         # a GPU under half its power at >90% util this long

Host tables may also set runs_root, train_command, nvidia_smi, user, known_hosts,
identity_file, ship, ship_from, python and record in [defaults]. Without a file, the one host is this machine. Every mistake
is a ConfigError naming the key: `hosts.gpu1.port: expected an integer from 1 to 65535, got "abc"`.
"""

from __future__ import annotations

import json
import os
import shlex
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from backends import alerts, ranges
from backends.gpu import DEFAULT_SMI
from backends.hosts import DEFAULT_RUNS_ROOT, Host, LocalHost, SSHHost
from backends.hosts import MAX_CHANNELS as DEFAULT_MAX_CHANNELS
from backends.kill import GRACE_S
from backends.recorder.start import on_reach
from backends.runs import TRAIN_COMMAND
from backends.ship import local_package, sync
from backends.ship.deliver import DEFAULT_PYTHON, Delivery
from training.contract import local_runs_root


class ConfigError(Exception):
    def __init__(self, key: str, problem: str, path: str | None = None):
        where = f"{path}: " if path else ""
        super().__init__(f"{where}{key}: {problem}")
        self.key = key
        self.problem = problem


def _show(value: Any) -> str:
    try:
        return json.dumps(value)
    except TypeError:
        return str(value)


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, f"expected a non-empty string, got {_show(value)}")
    return value


def _argv(key: str, value: Any) -> list[str]:
    """A command: a list of strings, or one string split as a shell would."""
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as e:
            raise ConfigError(key, f"cannot split {_show(value)}: {e}") from None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(key, f"expected a list of strings or a string, got {_show(value)}")


def _command(key: str, value: Any) -> list[str]:
    argv = _argv(key, value)
    if not argv:
        raise ConfigError(key, "expected a command, got an empty one")
    return argv


def _bounded(bounds: ranges.Bounds):
    """A numeric setting, checked against its range (backends/ranges.py)."""

    def check(key: str, value: Any) -> int | float:
        try:
            return bounds.check(value)
        except ValueError as e:
            raise ConfigError(key, f"{e}, got {_show(value)}") from None

    return check


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(key, f"expected true or false, got {_show(value)}")


def _names(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, list) and all(isinstance(v, str) and v and "/" not in v for v in value):
        return tuple(value)
    raise ConfigError(key, f"expected a list of file or directory names (globs, no '/'), got {_show(value)}")


# [[hosts.X.sync]]: a directory of this machine's, where it goes on the host.
# (Its built-in values are sync.SyncEntry's.)
_SYNC = {"from": _string, "to": _string, "exclude": _names, "max_mib": _bounded(ranges.SYNC_MIB)}


def _syncs(key: str, value: Any) -> list[sync.SyncEntry]:
    if not isinstance(value, list):
        raise ConfigError(key, f"expected [[{key}]] tables, got {_show(value)}")
    entries = []
    for i, table in enumerate(value):
        given = _check_table(f"{key}[{i}]", table, _SYNC)
        for needed in ("from", "to"):
            if needed not in given:
                raise ConfigError(f"{key}[{i}].{needed}", "missing: a sync names the directory here (from) and there (to)")
        if not given["to"].startswith(("/", "~")):
            raise ConfigError(f"{key}[{i}].to", f"expected an absolute path on the host (or ~/…), got {_show(given['to'])}")
        entries.append(sync.SyncEntry(given.pop("from"), given.pop("to"), **given))
    return entries


# Each setting's check; its built-in value is its dataclass field's (below).
SHARED_SCHEMA = {
    "runs_root": _string,
    "train_command": _command,
    "nvidia_smi": _string,
    "user": _string,
    "known_hosts": _string,
    "identity_file": _string,
    "ship": _bool,
    "ship_from": _string,
    "python": _string,
    "record": _bool,
}
DEFAULTS_SCHEMA = {**SHARED_SCHEMA, "grace_s": _bounded(ranges.GRACE), "poll_ms": _bounded(ranges.POLL_MS)}
HOST_SCHEMA = {
    **SHARED_SCHEMA,
    "address": _string,
    "port": _bounded(ranges.PORT),
    "jump": _string,
    "prefix": _argv,
    "max_channels": _bounded(ranges.MAX_CHANNELS),
    "sync": _syncs,
}

# [alerts]: where alerts go beyond the screen, and when they are called.
ALERTS_SCHEMA = {
    "command": _command,
    "timeout_s": _bounded(ranges.ALERT_TIMEOUT),
    "stall_floor_s": _bounded(ranges.STALL_FLOOR),
    "underfed_s": _bounded(ranges.UNDERFED),
}


def _alerts_built_in() -> dict[str, Any]:
    """[alerts] as a file that sets none of it: backends.alerts' own values."""
    return {"command": None, "timeout_s": alerts.COMMAND_TIMEOUT_S,
            "stall_floor_s": alerts.Rules.stall_floor_s, "underfed_s": alerts.Rules.underfed_s}  # fmt: skip


@dataclass(kw_only=True)
class Shared:
    """The settings a host table may take from [defaults], each default written here alone."""

    runs_root: str = DEFAULT_RUNS_ROOT
    train_command: list[str] = field(default_factory=lambda: list(TRAIN_COMMAND))
    nvidia_smi: str = DEFAULT_SMI
    user: str | None = None
    known_hosts: str | None = None
    identity_file: str | None = None
    ship: bool = False  # launches and relaunches ship code unless told not to
    ship_from: str | None = None  # the package to ship; None: this trackside's own
    python: str = DEFAULT_PYTHON  # the interpreter that runs shipped code on the host
    record: bool = True  # the first command to reach the host starts its GPU recorder


@dataclass(kw_only=True)
class Defaults(Shared):
    """[defaults]: what every host takes unless its table says, and the dashboard's own."""

    grace_s: float = GRACE_S
    poll_ms: int = 1000


@dataclass
class HostConfig(Shared):
    name: str
    address: str | None = None  # None: this machine
    port: int | None = None
    jump: str | None = None  # the name of another host of the file
    prefix: list[str] = field(default_factory=list)
    max_channels: int = DEFAULT_MAX_CHANNELS
    sync: list[sync.SyncEntry] = field(default_factory=list)
    jump_config: HostConfig | None = field(default=None, repr=False, compare=False)

    def delivery(self) -> Delivery:
        """What a shipping launch takes to this host (backends.ship.deliver)."""
        package = Path(self.ship_from).expanduser() if self.ship_from else local_package()
        return Delivery(package, self.python, tuple(self.sync))

    @property
    def is_local(self) -> bool:
        return self.address is None

    def make_host(self, jump_host: SSHHost | None = None) -> Host:
        """A Host for this entry, which starts its GPU recorder when first reached unless
        told not to; its jump host is made too unless one is given to share."""
        host = self._host(jump_host)
        if self.record:
            host.on_reach = on_reach(self.nvidia_smi)
        return host

    def _host(self, jump_host: SSHHost | None) -> Host:
        if self.address is None:
            return LocalHost(self.name, prefix=self.prefix, runs_root=self.runs_root)
        if jump_host is None and self.jump_config is not None:
            jump_host = self.jump_config.make_host()
        return SSHHost(
            self.name,
            self.address,
            user=self.user,
            port=self.port,
            jump=jump_host,
            known_hosts=self.known_hosts,
            client_keys=[os.path.expanduser(self.identity_file)] if self.identity_file else None,
            prefix=self.prefix,
            runs_root=self.runs_root,
            max_channels=self.max_channels,
        )


@dataclass
class Config:
    hosts: list[HostConfig]
    defaults: Defaults = field(default_factory=Defaults)
    path: str | None = None
    alerts: dict[str, Any] = field(default_factory=_alerts_built_in)

    @property
    def alert_rules(self) -> alerts.Rules:
        return alerts.Rules(underfed_s=self.alerts["underfed_s"], stall_floor_s=self.alerts["stall_floor_s"])

    def host(self, name: str) -> HostConfig:
        for host in self.hosts:
            if host.name == name:
                return host
        raise ConfigError("--host", f"no host named {_show(name)} (configured: {', '.join(h.name for h in self.hosts)})")

    def make_hosts(self) -> dict[str, Host]:
        """One Host per entry; hosts that share a jump host share its connection."""
        made: dict[str, Host] = {}

        def make(entry: HostConfig) -> Host:
            if entry.name not in made:
                jump = make(entry.jump_config) if entry.jump_config else None
                made[entry.name] = entry.make_host(jump)
            return made[entry.name]

        for entry in self.hosts:
            make(entry)
        return made


def default_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "trackside" / "config.toml"


def _check_table(prefix: str, table: Any, schema: dict) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(prefix, f"expected a table, got {_show(table)}")
    checked = {}
    for key, value in table.items():
        if key not in schema:
            raise ConfigError(f"{prefix}.{key}", f"unknown setting (known: {', '.join(sorted(schema))})")
        checked[key] = schema[key](f"{prefix}.{key}", value)
    return checked


def parse_config(data: dict[str, Any]) -> Config:
    """A Config from parsed TOML data; ConfigError names the first bad key."""
    for key in data:
        if key not in ("defaults", "hosts", "alerts"):
            raise ConfigError(key, "unknown table (known: alerts, defaults, hosts)")
    given_defaults = _check_table("defaults", data.get("defaults", {}), DEFAULTS_SCHEMA)
    defaults = Defaults(**given_defaults)
    shared = {f.name: getattr(defaults, f.name) for f in fields(Shared)}

    tables = data.get("hosts", {})
    if not isinstance(tables, dict):
        raise ConfigError("hosts", f"expected a table of host tables, got {_show(tables)}")
    hosts = []
    for name, table in tables.items():
        given = _check_table(f"hosts.{name}", table, HOST_SCHEMA)
        settings = {**shared, **given}
        if settings.get("address") is None:
            for remote_only in ("port", "jump", "user", "known_hosts", "identity_file"):
                if remote_only in given:
                    raise ConfigError(f"hosts.{name}.{remote_only}", "only for remote hosts: set address too")
        if settings.get("address") is None and "runs_root" not in given and "runs_root" not in given_defaults:
            settings["runs_root"] = local_runs_root()
        hosts.append(HostConfig(name=name, **settings))
    if not hosts:
        hosts = [HostConfig("local", **{key: shared[key] for key in ("runs_root", "train_command", "nvidia_smi", "ship", "ship_from", "python", "record")})]
        if "runs_root" not in given_defaults:
            hosts[0].runs_root = local_runs_root()

    by_name = {host.name: host for host in hosts}
    for host in hosts:
        if host.jump is None:
            continue
        key = f"hosts.{host.name}.jump"
        target = by_name.get(host.jump)
        if target is None:
            raise ConfigError(key, f"no host named {_show(host.jump)} in [hosts]")
        if target.address is None:
            raise ConfigError(key, f"{_show(host.jump)} is this machine, not an SSH host to jump through")
        host.jump_config = target
    for host in hosts:
        seen = [host.name]
        hop = host.jump_config
        while hop is not None:
            if hop.name in seen:
                raise ConfigError(f"hosts.{host.name}.jump", f"jump hosts loop: {' -> '.join(seen + [hop.name])}")
            seen.append(hop.name)
            hop = hop.jump_config
    given_alerts = _check_table("alerts", data.get("alerts", {}), ALERTS_SCHEMA)
    return Config(hosts, defaults, alerts={**_alerts_built_in(), **given_alerts})


def load_config(path: str | None = None) -> Config:
    """The config at `path` (must exist), else at the default place (may be absent)."""
    file = Path(path).expanduser() if path else default_path()
    if not file.is_file():
        if path:
            raise ConfigError("--config", f"no such file: {path}")
        return parse_config({})
    try:
        data = tomllib.loads(file.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(file), f"not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(str(file), f"cannot read: {e}") from None
    try:
        config = parse_config(data)
    except ConfigError as e:
        raise ConfigError(e.key, e.problem, str(file)) from None
    config.path = str(file)
    return config
