"""A run's past, as `trackside replay` steps through it: what its host kept (metrics.jsonl,
its log or its pane's recording, the kill journal, the GPU recording) read once, then the
run as it stood at any moment, and the moments that matter. Textual-free: the screen
(tui/screens/replay.py) only draws what these say.

- `tape`: a log's bytes and the recording's index of its size over time (LogSize): the
  log as it was at a moment, and a console's fold up to it
- `frame`: the run at a moment: its events, its log, its GPUs
- `moments`: the alerts that would have fired, OOM, stalls, skipped steps, stops,
  relaunches, the recorder's gaps, the exit
- `when`: `--at TIME`, absolute or relative to the run's start or end
- `read`: reading all of it from the host, through backends
"""

from backends.history.frame import Frame, GpuAt, History, frame_at
from backends.history.moments import Moment, moments_of
from backends.history.tape import LogAt, Tape
from backends.history.when import WhenError, parse_when

__all__ = ["Frame", "GpuAt", "History", "LogAt", "Moment", "Tape", "WhenError", "frame_at", "moments_of", "parse_when"]
