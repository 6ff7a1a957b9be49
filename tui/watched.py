"""What the dashboard is given to watch: each host with its config's settings, and the
demo's run. Its own module: the app and the operator's actions both name them, and the
actions import nothing of the app's."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends import gpu
from backends.hosts import Host
from backends.ship.deliver import Delivery


@dataclass
class Watched:
    """A host the dashboard watches, with the settings its config gave it."""

    host: Host
    smi: str = gpu.DEFAULT_SMI
    train_command: list[str] | None = None
    # What a relaunch ships there when its run recorded none (the host's `ship = true`).
    ship: Delivery | None = None
    record: bool = True  # its GPU recorder runs (the config's `record`): runs' energy is read from it


@dataclass
class Demo:
    """`trackside demo`: the run to launch on the first host, shown on its run screen."""

    argv: list[str]
    session: str
    params: dict = field(default_factory=dict)
