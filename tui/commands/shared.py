"""What the commands share: a parser whose mistakes are usage errors (exit 2, one line
naming the command), rows in aligned columns, and the hosts a command reads."""

from __future__ import annotations

from dataclasses import dataclass

from backends import sanitize
from backends.config import Config
from backends.hosts import Host
from training.contract import OneLineParser, UsageError


class Said(UsageError):
    """A usage error whose message already names the command (`trackside kill: …`)."""


class Parser(OneLineParser):
    """The one-line parser, its error naming the command (`trackside kill: --grace: …`)."""

    def error(self, message: str):
        try:
            super().error(message)
        except UsageError as error:
            raise Said(f"{self.prog}: {error}") from None


def table(rows: list[tuple[str, ...]]) -> str:
    """Rows in aligned columns, two spaces apart; the last column as it is (it may be long).
    Each cell one line, cleaned (backends.sanitize), so the columns hold whatever a cell said."""
    rows = [tuple(sanitize.line(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(row, widths)), row[-1]]).rstrip() for row in rows)


@dataclass
class Fleet:
    """The config's hosts as a command reads them: `names`, those it reads (every
    configured host, or the one --host names); `hosts`, every host made (a multi-node
    run's other nodes are reached through them)."""

    config: Config
    hosts: dict[str, Host]
    names: list[str]

    @property
    def train_commands(self) -> dict[str, list[str]]:
        return {e.name: e.train_command for e in self.config.hosts}

    @property
    def smis(self) -> dict[str, str]:
        return {e.name: e.nvidia_smi for e in self.config.hosts}
