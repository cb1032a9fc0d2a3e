"""The console when stdout is a pipe (a cluster log), the run-level ETA, and validation success in the epoch
lines."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

from amago_app.logging.console import RunConsole, success_summary
from conftest import TINY


def test_non_terminal_output_is_plain_full_width_lines(tmp_path):
    overrides = [o for o in TINY if not o.startswith("logger.verbose")]
    env = {**os.environ, "COLUMNS": "30", "OMP_NUM_THREADS": "1"}  # a narrow "terminal" must not matter
    r = subprocess.run([sys.executable, "-m", "amago_app.cli.train", *overrides, "trainer.epochs=3",
                        "trainer.threads=1", "logger.progress_interval=0", "hydra.run.dir=run"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # stdout: a pipe
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "\x1b[" not in out  # no escape codes (colors, cursor moves of live bars)
    lines = out.splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 3
    for line in epochs:  # every field of an epoch on its own line, none cut by wrapping
        assert re.match(r"^epoch +\d+ val return \S+  val success \S+  (\S+( \S+)* \S+  )*frames \S+  time \S+"
                        r"  ETA \d+:\d\d:\d\d$", line), line
        assert re.search(r"  env steps/s [\d,]+  updates/s [\d.]+  loss \S+  ", line), line
    assert any("trainable parameters" in line and "agent Agent:" in line for line in lines)
    progress = [line for line in lines if line.startswith("progress: ")]
    assert any(re.search(r"\| (collect|train|validate) [\d,]+/[\d,]+ .*/s \| run ETA ", p) for p in progress)
    assert re.search(r"^final validation return \S+  success \S+$", lines[-1]), lines[-1]


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_run_eta_shows_when_an_epoch_takes_longer_than_30s():
    clock = FakeClock()
    stream = io.StringIO()
    con = RunConsole(total_epochs=4, mode="plain", progress_interval=60, stream=stream, clock=clock)
    with con.phase("train", 100, "updates") as advance:
        for _ in range(100):
            clock.now += 0.45  # 45 s per epoch
            advance(1)
    con.end_epoch(0, {"val return": "0.5"})
    assert stream.getvalue().splitlines()[-1] == "epoch    0 val return 0.5  ETA 0:02:15"  # 3 epochs x 45 s
    with con.phase("collect", 1000, "env steps") as advance:
        clock.now += 61
        advance(500)  # a progress line once the interval has passed; 61 s into epoch 1 of 45 s on average:
        # at least the 2 epochs after this one are left
    assert stream.getvalue().splitlines()[-1] == \
        "progress: 1/4 epochs done | collect 500/1,000 env steps, 8.2 env steps/s | run ETA 0:01:30"


def test_rich_bar_run_eta_uses_finished_epochs():
    clock = FakeClock()
    con = RunConsole(total_epochs=3, mode="rich", stream=io.StringIO(), clock=clock)
    clock.now += 100.0
    con.end_epoch(0, {"val return": "1", "val success": "1"})
    run_task = con._progress.tasks[0]
    (eta_column,) = [c for c in con._progress.columns if type(c).__name__ == "_RunETAColumn"]
    assert eta_column.render(run_task).plain == "ETA 0:03:20"
    assert run_task.fields["note"] == "last val return 1  last val success 1"
    con.close()


def test_success_summary_averages_success_and_per_attempt_rates():
    val = {"Average Total Return in A": 1.0, "Average Success in A": 1.0, "Average Success in B": 0.5}
    assert success_summary(val) == {"val success": "0.75"}
    kshot = {f"Average Episode {i} Success in L": s for i, s in ((1, 0.25), (2, 0.5), (3, 0.875))}
    assert success_summary(kshot) == {"val success by attempt": "0.25/0.5/0.88"}
    assert success_summary({"Average Total Return in A": 1.0}) == {}
