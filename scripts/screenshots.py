"""Render the real app to screenshots/: the run screen mid-training, the fleet, the kill
dialog and the edit form, as SVG (and PNG when cairosvg is installed).

    .venv/bin/python scripts/screenshots.py

The data are the snapshot tests' fixed fleet (tests/tui/sample.py), fed as monitor
messages, with the llama3-8b drafter shape so the edit form predicts memory.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.tui.sample import RUN_KEY, feed, make_app  # noqa: E402
from training.config import PRESETS  # noqa: E402
from tui.screens.edit import EditScreen  # noqa: E402
from tui.screens.kill import KillConfirm, KillPlan  # noqa: E402

OUT = REPO / "screenshots"
SIZE = (160, 48)


async def shoot() -> list[Path]:
    app = make_app()
    saved = []

    def save(name: str) -> None:
        saved.append(Path(app.save_screenshot(f"{name}.svg", str(OUT))))

    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot, model=PRESETS["llama3-8b"].to_dict())
        save("fleet")
        app.open_run(RUN_KEY)
        await pilot.pause()
        save("run")
        plan = KillPlan(RUN_KEY, "h200-box", "dflash", [4200, 4201, *range(4242, 4250)],
                        [(i, 4242 + i, 40000) for i in range(8)], None)  # fmt: skip
        app.push_screen(KillConfirm(plan))
        await pilot.pause()
        save("kill")
        app.pop_screen()
        run = app.runs[RUN_KEY]
        app.push_screen(EditScreen(run, app.hosts[run.host], {"max_seq_len": 98304, "ttt_steps": 5}))
        await pilot.pause()
        save("edit")
    return saved


def to_png(svgs: list[Path]) -> bool:
    try:
        import cairosvg
    except ImportError:
        return False
    for svg in svgs:
        cairosvg.svg2png(url=str(svg), write_to=str(svg.with_suffix(".png")))
    return True


def main() -> int:
    OUT.mkdir(exist_ok=True)
    svgs = asyncio.run(shoot())
    pngs = to_png(svgs)
    for svg in svgs:
        print(svg.relative_to(REPO), "(+ .png)" if pngs else "")
    if not pngs:
        print("PNG skipped: pip install cairosvg to make them", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
