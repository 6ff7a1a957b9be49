"""The run screen's `g`: its loss chart, or the run's whole life by time with its host's
GPUs (tui/widgets/gpu_life.py; both do not fit at 80×24). The recording is read in a
worker, through backends (backends/recorder's reader), and again every LIFE_READ_S while
shown: the widget only draws."""

from __future__ import annotations

from backends.history.life import last_sample, read_on
from backends.runs.rundir import epoch
from backends.hosts import HostError
from backends.logs.series import number
from backends.recorder.read import read_recording
from backends.runs.status import RunStatus
from tui.guard import Guarded
from tui.state import RunState
from tui.widgets.gpu_life import GpuLife
from tui.widgets.loss_chart import LossChart

LIFE_READ_S = 30.0


def life_span(run: RunState, now: float) -> tuple[float, float]:
    """From the run's start (its launch, else its first event or the recording of its
    pane) to its last step once ended, else now."""
    first = (run.start or {}).get("time") if run.start else (run.steps[0].get("time") if run.steps else None)
    start = epoch(run.info.started) or number(first) or run.info.recorded_since or now - 3600.0
    last = number(run.last.get("time")) if run.last else None
    end = last if run.status is not RunStatus.RUNNING and last is not None else now
    return start, max(end, start + 1.0)



class LifeToggle(Guarded):
    """Mixed into the run screen, which has `run`, a LossChart and a GpuLife (hidden at first)."""

    def on_mount(self) -> None:  # Textual calls each class's handler, the screen's own too
        self.set_interval(LIFE_READ_S, self.read_life)

    def action_gpu_life(self) -> None:
        """The loss chart, or the run's life by time with its host's GPUs (both do not fit
        at 80×24): the recording is read in a worker, through backends."""
        life, loss = self.query_one(GpuLife), self.query_one(LossChart)
        life.display, loss.display = not life.display, life.display
        self.read_life()

    def read_life(self) -> None:
        life, run = self.query_one(GpuLife), self.run
        if life.display and run is not None:
            life.show(run, life.recording, *life_span(run, self.app.clock()), life.note)
            self.run_worker(self._life_read(run), group="life", exclusive=True, exit_on_error=False)

    async def _life_read(self, run: RunState) -> None:
        start, end = life_span(run, self.app.clock())
        life, note = self.query_one(GpuLife), ""
        known = life.recording if life.run is not None and life.run.key == run.key and life.start == start else None
        try:  # from the run's start once, then on from the last sample read
            newer = await read_recording(self.app.watched[run.host].host, last_sample(known) or start)
            recording = newer if known is None else read_on(known, newer)
        except HostError as error:
            recording, note = None, f"the GPU recording on {run.host} cannot be read: {error}"
        if self.is_mounted and self.run is run:
            self.query_one(GpuLife).show(run, recording, start, end, note)

