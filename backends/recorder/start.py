"""The recorder's tmux session on a host: started by the first trackside command that
reaches the host (`on_reach`, which backends/config.py gives each host whose config does
not say `record = false`), again by the next command after it died (a command that
reaches the host REACH_AGAIN_S after the last check: a dashboard's own), stopped on request.

Checking it costs one host command and one tmux query while it runs. It runs on
trackside's tmux server (the host's `tmux_socket`), one per runs root: its session is
SESSION and the root directory's device and inode (`session_of`), marked with
tmux.RECORDER_OPTION so no listing takes it for a run; its program is the sources of
layout.py, files.py and agent.py, given inline (compressed, as tmux takes a command of
16 KiB at most), with the runs root
it records into checked first as every write to it is (backends/runsroot.py). A host
where the configured nvidia-smi is no command has no GPU to record: nothing starts there.
"""

from __future__ import annotations

import base64
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

from backends import runsroot, tmux
from backends.hosts import Host, HostError
from backends.recorder import agent, files, layout
from backends.ship.deliver import DEFAULT_PYTHON

SESSION = "trackside-recorder"
HELD = "stopped-by-hand"  # under gpu/: a recorder stopped by `trackside record stop` stays so
PYTHON = DEFAULT_PYTHON  # the host's python3

# The recorder's program, run by `python3 -c` (its "$@" after the program: agent.main's
# argv): each module's source run in turn in one namespace, each compiled on its own (its
# own `from __future__`), agent.py's last, as it starts the recorder.
_SOURCES = "\0".join(Path(module.__file__).read_text() for module in (layout, files, agent))
_BOOT = "import base64,zlib\ng=globals()\nfor s in zlib.decompress(base64.b64decode('{}')).decode().split('\\0'):exec(s,g)".format(
    base64.b64encode(zlib.compress(_SOURCES.encode(), 9)).decode()
)

# "$1" the runs root (a leading ~ is $HOME), "$2" the tmux socket (empty: the default
# server), "$3" nvidia-smi, "$4" ensure (what a command that reaches the host asks):
# start it unless it runs (a dead pane is replaced) or was stopped by hand; start: the
# same, and no longer held stopped; status: say; stop: end it, and hold it stopped (the
# directory HELD under gpu/: never a link, as dirs_ok makes it). Then python3, the
# recorder's program and its arguments after its root, socket and nvidia-smi. The recorder is the runs root's: its session is named
# after the root directory (`session_of`), so one of another root (a benchmark's
# temporary one) on the same tmux server is never taken for it, nor stopped.
# Each argument of the recorder's command goes to tmux as tmux.SHELL_ARGUMENT gives it (a
# runs root ending in ';' would end tmux's command there).
# Prints one word: running, started, stopped, absent (not running), held (not running,
# stopped by hand), no-smi, no-python.
_ENSURE = r"""root=$1 socket=$2 smi=$3 what=$4; shift 4
@ARGUMENT@
case $root in "~") root=$HOME ;; "~/"*) root=$HOME/${root#"~/"} ;; esac
t() { tmux ${socket:+-L "$socket"} "$@"; }
look() {  # $s: this root's session (none: no root); $state: its pane_dead (empty: none)
  s= state=
  id=$(stat -L -c '%d-%i' -- "$root" 2>/dev/null) || return 0
  s=@SESSION@-$id
  state=$(t display-message -p -t "=$s:" '#{pane_dead}' 2>/dev/null)
}
held=$root/gpu/@HELD@
is_held() { [ -d "$held" ] && [ ! -L "$held" ]; }
look
case $what in
  status) [ "$state" = 0 ] && echo running || { is_held && echo held || echo absent; }; exit 0 ;;
  stop)
    if [ -n "$state" ] && t kill-session -t "=$s" 2>/dev/null; then said=stopped; elif [ -n "$s" ]; then said=held; else said=absent; fi
    # Held where the root passes its checks: one refused is never recorded into anyway
    # (a start refuses it), and a stop is never refused.
    [ -z "$s" ] || (root_ok "$root"; dirs_ok "$root" gpu/@HELD@) 2>/dev/null || [ "$said" != held ] || said=absent
    echo "$said"; exit 0 ;;
esac
[ "$state" = 0 ] && { echo running; exit 0; }
# By their paths here: the tmux server's PATH may not be this shell's.
smi=$(command -v "$smi") || { echo no-smi; exit 0; }
py=$(command -v "$1") || { echo no-python; exit 0; }
[ -d "$root" ] || mkdir -p -- "$root" || exit 1
root_ok "$root"; dirs_ok "$root" gpu
if is_held; then
  [ "$what" = start ] || { echo held; exit 0; }
  rmdir -- "$held" || exit 1
fi
look
[ -n "$s" ] || exit 1
[ -z "$state" ] || t kill-session -t "=$s" 2>/dev/null
code=$2; shift 2
set -- "$py" -c "$code" "$root" "$socket" "$smi" "$@"
n=$#; while [ "$n" -gt 0 ]; do tmux_argument "$1"; shift; set -- "$@" "$a"; n=$((n - 1)); done
t new-session -d -s "$s" -x 80 -y 10 -- "$@" \; \
  set-option -t "=$s:" @OPTION@ 1 \; set-option -t "=$s:" remain-on-exit off || exit 1
echo started
""".replace("@SESSION@", SESSION).replace("@OPTION@", tmux.RECORDER_OPTION).replace("@HELD@", HELD).replace("@ARGUMENT@", tmux.SHELL_ARGUMENT)


def session_of(root: str) -> str:
    """The tmux session of the recorder of the runs root `root` on this machine (_ENSURE
    names it so): SESSION, then the root directory's device and inode."""
    st = os.stat(root)
    return f"{SESSION}-{st.st_dev}-{st.st_ino}"


@dataclass(frozen=True)
class Settings:
    """How often it samples, and how much it keeps (layout.py's defaults)."""

    tick_s: float = layout.TICK_S
    loop_ms: int = layout.LOOP_MS
    keep_days: int = layout.KEEP_DAYS
    cap_bytes: int = layout.CAP_BYTES


async def recorder(host: Host, what: str, smi: str, settings: Settings = Settings()) -> str:
    """Start unless stopped by hand (`ensure`), start (`start`), check (`status`) or stop
    and hold stopped (`stop`) the host's recorder; its state in a word (_ENSURE's). HostError when the host cannot, RunsRootRefused where its runs
    root is not this user's alone."""
    args = [
        host.runs_root, host.tmux_socket or "", smi, what, PYTHON, _BOOT,
        f"{settings.tick_s:g}", str(settings.loop_ms), str(settings.keep_days), str(settings.cap_bytes),
    ]  # fmt: skip
    result = await runsroot.run(host, _ENSURE, args)
    if not result.ok:
        raise HostError(host.name, f"cannot start the GPU recorder: {result.stderr.strip() or f'exit status {result.returncode}'}")
    return result.stdout.strip()


def on_reach(smi: str, settings: Settings = Settings()):
    """What a host does when a command reaches it (backends/hosts/base.py says when):
    start its recorder unless it runs or was stopped by hand. A host that cannot is left
    to the command, which says why in its own words."""

    async def reached(host: Host) -> None:
        try:
            await recorder(host, "ensure", smi, settings)
        except HostError:
            pass

    return reached
