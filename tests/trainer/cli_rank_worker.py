"""`amago-train` exactly as the CLI runs it (argv = overrides), then this rank's state into OUT/rank{R}-{tag}.pt.

Usage under a launcher: torchrun ... cli_rank_worker.py OUT TAG [amago-train overrides...]
"""

import sys
from pathlib import Path

import torch

import amago_app.trainer.run as run

out, tag = Path(sys.argv[1]), sys.argv[2]
sys.argv = [sys.argv[0], *sys.argv[3:]]


state: dict = {}  # filled by the trainer when it has learned, written once amago-train has returned


class RecordingTrainer(run.Trainer):
    def learn(self):
        result = super().learn()
        state.update({"agent": self.agent.state_dict(), "rank": self.rank, "run_dir": str(self.run_dir),
                      "epoch": self.counters.epoch, "gradient_steps": self.counters.gradient_steps,
                      "total_frames": self.counters.total_frames,
                      "train_env_seed": self.train_rollout.seed, "val_env_seed": self.val_rollout.seed,
                      "world_size": self.accelerator.num_processes})
        return result


run.Trainer = RecordingTrainer
from amago_app.cli.train import main  # noqa: E402

main()
# amago-train ends a launched worker's process group itself (gloo can abort at interpreter exit otherwise)
state["process_group_ended"] = not torch.distributed.is_initialized()
torch.save(state, out / f"rank{state['rank']}-{tag}.pt")
