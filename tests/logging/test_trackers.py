"""TensorBoard and wandb get the metrics of the local JSONL files, with the same names and x-axes; read back
from the real event files and the real wandb offline run files."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

from amago_app.logging.metrics import read_jsonl
from conftest import TINY


def train(*args, cwd: Path, multirun: bool = False) -> subprocess.CompletedProcess:
    flags = ["--multirun"] if multirun else []
    r = subprocess.run([sys.executable, "-m", "amago_app.cli.train", *flags, *TINY, "trainer.threads=1", *args], cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_tensorboard_event_files_have_the_jsonl_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train("logger=tensorboard", "trainer.epochs=2", "hydra.run.dir=run", cwd=tmp_path)
    run = tmp_path / "run"
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for section, step_axis in (("val", "total_frames"), ("train", "total_frames"), ("buffer", "total_frames"),
                               ("train-update", "gradient_steps")):
        records = read_jsonl(run / "metrics" / f"{section}.jsonl")
        names = {k for r in records for k in r if k.startswith(section + "/")}
        assert names and names <= tags, (section, names - tags)
        for name in sorted(names)[:3]:
            logged = [(r[step_axis], r[name]) for r in records if isinstance(r.get(name), float)]
            scalars = [(e.step, e.value) for e in events.Scalars(name)]
            assert [s for s, _ in scalars] == [s for s, _ in logged], name
            assert all(abs(a - b) < 1e-5 * max(1, abs(b)) for (_, a), (_, b) in zip(scalars, logged)), name
    assert {"x-axes/epoch", "x-axes/gradient_steps", "x-axes/wall_time"} <= tags
    # the success metric, at the validation frame counts
    success = events.Scalars("val/Average Success in TMazePassive-H3")
    assert [e.step for e in success] == [0, 16, 32]
    # the run's hyperparameters (accelerate's store_init_configuration)
    (hparams,) = run.glob("tensorboard/*/hparams.yml")
    assert "trainer.epochs: 2" in hparams.read_text()


def wandb_records(path: Path) -> list:
    """The protobuf records of a wandb offline `.wandb` file (a LevelDB-style log: a 7-byte file header, then
    32 KiB blocks of [crc32, length, type] chunks; a record may span blocks as first/middle/last chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, out, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):  # full or last chunk
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def test_wandb_sweep_jobs_share_a_group_with_distinct_names_and_total_frames_axis(tmp_path):
    train("logger=wandb", "logger.mode=offline", "trainer.epochs=1", "seed=0,1", cwd=tmp_path, multirun=True)
    (sweep,) = (tmp_path / "multirun" / "tmaze-H3").iterdir()
    runs = {}
    for job in ("0", "1"):
        (offline,) = (sweep / job / "wandb").glob("offline-run-*/run-*.wandb")
        records = wandb_records(offline)
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        metrics = {(r.metric.glob_name or r.metric.name): r.metric.step_metric for r in records
                   if r.WhichOneof("record_type") == "metric"}
        config = {item.key: json.loads(item.value_json) for item in run.config.update}
        runs[job] = (run, metrics, config)
    group = f"tmaze-H3/{sweep.name}"
    assert runs["0"][0].run_group == runs["1"][0].run_group == group
    assert runs["0"][0].display_name == "tmaze-H3 #0: seed=0"
    assert runs["1"][0].display_name == "tmaze-H3 #1: seed=1"
    metrics = runs["0"][1]
    assert metrics["val/*"] == metrics["train/*"] == metrics["buffer/*"] == "total_frames"
    assert metrics["train-update/*"] == "gradient_steps"
    assert {"total_frames", "gradient_steps", "epoch", "wall_time"} <= set(metrics)
    assert runs["1"][2]["seed"] == 1 and runs["1"][2]["logger"]["group"] == group
