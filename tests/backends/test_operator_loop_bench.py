"""bench/operator_loop.py's flow on the CPU (`--smoke`), so the H200's call finds it whole:
R afresh, the CLI's kill and `relaunch --resume`, R with c, each run at the step it should."""
import json

import pytest

from tests.bench_runs import run_bench


@pytest.mark.slow
def test_the_operator_loop_resumes_each_relaunch_where_its_parent_stopped(tmp_path):
    run_bench("operator_loop.py", "--drafter", "eagle3", "--smoke", out=tmp_path, timeout=600)
    result = json.loads((tmp_path / "operator_loop_eagle3.json").read_text())
    r, resumed, rc = result["R"], result["resumed"], result["R_resume"]
    # R: started as the SIGTERM went out, it waited for the stopping run.
    assert r["checkpoint"] == "durable" and "replaced_run" in r["startup_s"]
    assert r["process_started_s"] < r["to_start_s"] <= r["to_first_step_s"]
    # The CLI's resume, then R with c: each at its parent's last step, the next step first.
    assert resumed["resumed_from_step"] == result["stopped_at_step"] and resumed["first_step"] == result["stopped_at_step"] + 1
    assert rc["resumed_from_step"] == rc["stopped_at_step"] and rc["first_step"] == rc["stopped_at_step"] + 1
    assert "replaced_run" in rc["startup_s"] and rc["max_seq_len"] == 352
    # Where each resume's state came from: the CLI's after the kill made it durable; R with
    # c's from the writer's RAM, or from the disk (its wait said) where it was done already.
    assert resumed["resume_source"] == "disk" and "resume_wait" in resumed["startup_s"]
    assert rc["resume_source"] == "ram" or (rc["resume_source"] == "disk" and "resume_wait" in rc["startup_s"])
    assert result["kill"]["checkpoint"] == "durable"
