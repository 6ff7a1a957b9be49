"""A runs root on its host, trusted only where no other user can change it.

trackside runs as root on GPU boxes, and writes, appends to and reads files under the
runs root. A root (or a directory or file in it) that another user can write, or that is
not this user's, would let them plant what root then writes through (a link to a file of
root's) or reads out (a link to /etc/shadow). So every host command that touches a runs
root begins with `PRELUDE`, whose shell functions refuse such a path with one line naming
it (exit REFUSED, raised as `RunsRootRefused`):

- `root_ok ROOT`: every directory above ROOT (as written, and as it resolves) is root's
  or this user's and writable by no other, unless sticky like /tmp; ROOT itself is this
  user's, and no other can write it. An absent ROOT passes (nothing in it to trust).
- `dirs_ok ROOT REL...`: each directory from ROOT down to ROOT/REL, made 0700 where
  absent, is this user's and no other can write it; never a link.
- `files_ok PATH...`: each path that exists is a regular file (not a link) of this
  user's that no other can write.
- `above_ok DIR...`: each DIR and every directory above it, as `root_ok` asks of those
  above a root, for a reader that knows no root (it checks each file it opens).

Each refuses a path with a line break in it: the checks read paths one a line.

With the directories so checked, nothing on the way can change between a check and a
use, so a file made under them is made where it was checked (`set -C` for new files,
`mktemp` for replacements, never through a link). The prelude sets `umask 077`:
everything made under a runs root is 0600, or 0700 for a directory.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.hosts import CommandResult, Host, HostError
from training.contract import UsageError

REFUSED = 77

# `stat`'s `%f` is the raw mode in hex: its type bits (S_IFMT 0170000: directory 0040000,
# regular 0100000) and its permission bits (022: writable by group or others; 01000 sticky).
PRELUDE = r"""umask 077
me=$(id -u)
refuse() { printf '%s\n' "$1" >&2; exit @REFUSED@; }
_why() {  # rule (above, or mine), uid, hex mode, path: why the path breaks the rule, or nothing
  _m=$((0x$3)); _t=$((_m & 0170000))
  if [ "$1" = above ]; then
    [ $_t -eq $((0040000)) ] || { echo "$4 is not a directory"; return; }
    [ "$2" = 0 ] || [ "$2" = "$me" ] || { echo "$4 is owned by uid $2, not by root or this user (uid $me)"; return; }
    [ $((_m & 022)) -eq 0 ] || [ $((_m & 01000)) -ne 0 ] || echo "$4 can be written by other users (mode $(printf %o $((_m & 07777))))"
  else
    [ $_t -ne $((0120000)) ] || { echo "$4 is a symbolic link (never followed)"; return; }
    [ $_t -eq $((0040000)) ] || [ $_t -eq $((0100000)) ] || { echo "$4 is neither a directory nor a regular file"; return; }
    [ "$2" = "$me" ] || { echo "$4 is owned by uid $2, not by this user (uid $me)"; return; }
    [ $((_m & 022)) -eq 0 ] || echo "$4 can be written by other users (mode $(printf %o $((_m & 07777))))"
  fi
}
_check() {  # rule, -L (follow links) or -l (do not), then paths one a line: refuse the first that breaks the rule
  [ -n "$3" ] || return 0
  _bad=$(printf '%s\n' "$3" | { set -f; IFS='
'; set -- $(cat); [ "$2" != -L ] || set -- -L "$@"; stat -c '%u %f %n' "$@" 2>/dev/null; } |
    while read -r _u _f _n; do _why "$1" "$_u" "$_f" "$_n"; done | head -n 1)
  [ -z "$_bad" ] || refuse "$_bad"
}
_one_line() {  # the checks read paths one a line: one with a line break would pass in pieces
  for _x in "$@"; do case $_x in *'
'*) refuse "a path with a line break in its name (never checked, never used)" ;; esac; done
}
_above() {  # the directories above each path, from /, one a line (a path ending in / counts itself)
  for _x in "$@"; do
    _p= _r=${_x#/}
    echo /
    while case $_r in */*) true ;; *) false ;; esac; do _p=$_p/${_r%%/*}; _r=${_r#*/}; printf '%s\n' "$_p"; done
  done | sort -u
}
root_ok() {
  _one_line "$1"
  [ -e "$1" ] || [ -L "$1" ] || return 0
  _real=$(cd -P -- "$1" 2>/dev/null && pwd -P) || refuse "$1 is not a directory"
  _check above -L "$(_above "$1" "$_real")"
  _check mine -L "$1"
}
dirs_ok() {
  _one_line "$@"
  _root=$1; shift
  for _rel in "$@"; do
    _d=$_root
    while [ -n "$_rel" ]; do
      _d=$_d/${_rel%%/*}
      case $_rel in */*) _rel=${_rel#*/} ;; *) _rel= ;; esac
      case " $_made " in *" $_d "*) continue ;; esac
      [ -e "$_d" ] || [ -L "$_d" ] || mkdir -m 700 -- "$_d" || [ -d "$_d" ] || exit 1
      _check mine -l "$_d"
      _made="$_made $_d"
    done
  done
}
files_ok() {
  _one_line "$@"
  for _x in "$@"; do if [ -e "$_x" ] || [ -L "$_x" ]; then _check mine -l "$_x"; fi; done
}
above_ok() {
  _one_line "$@"
  _check above -L "$(for _x in "$@"; do _above "$_x/"; _r=$(cd -P -- "$_x" 2>/dev/null && pwd -P) && _above "$_r/"; done)"
}
""".replace("@REFUSED@", str(REFUSED))


class RunsRootRefused(HostError, UsageError):
    """A runs root, or a path in it, that another user could change: refused, the line
    naming it (exit 2, as a setting to change)."""


def refusal(host: Host, result: CommandResult) -> RunsRootRefused | None:
    """The refusal a host command under PRELUDE ended with, or None."""
    if result.returncode != REFUSED:
        return None
    why = (result.stderr.strip().splitlines() or ["a path under the runs root another user could change"])[-1]
    return RunsRootRefused(host.name, f"refused: {why}")


async def run(host: Host, script: str, args: Sequence[str], *, input: str | None = None, timeout: float | None = 30.0) -> CommandResult:
    """`script` after PRELUDE, with `args` as its "$@"; RunsRootRefused where it refused."""
    result = await host.run(["sh", "-c", PRELUDE + script, "sh", *args], input=input, timeout=timeout)
    if (refused := refusal(host, result)) is not None:
        raise refused
    return result


async def check(host: Host, root: str) -> None:
    """RunsRootRefused unless `root` (absent, or as `root_ok` asks) is this user's alone."""
    result = await run(host, 'root_ok "$1"', [root])
    if not result.ok:
        raise HostError(host.name, f"cannot check the runs root {root}: {result.stderr.strip()}")
