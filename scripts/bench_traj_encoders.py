"""CPU cost of the memories at the same width: GRU, Transformer (KV cache) and Mamba (pure-PyTorch fallback).

- rollout: ms per env step for a batch of 8 envs, at rollout context 10, 100 and 1000 steps (best of the 10
  steps from each point on, in one continuous rollout after a warm-up rollout);
- training: ms per forward + backward over a batch of 24 windows of L = 64 and 256 timesteps (best of --reps).

Best-of figures measure the machine's capability, least disturbed by neighbours on a shared CPU.

Prints a table, then one JSON object per line. Usage: python scripts/bench_traj_encoders.py [--threads 2]
(`--smoke`: short contexts and windows, seconds, to check that it works).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch

from amago_app.nets.traj.gru import GRUTrajEncoder
from amago_app.nets.traj.mamba import MambaTrajEncoder
from amago_app.nets.traj.transformer import TransformerTrajEncoder

TSTEP_DIM = 128
WIDTH, LAYERS = 128, 2
ROLLOUT_ENVS, CONTEXTS, WINDOW = 8, (10, 100, 1000), 10
TRAIN_BATCH, TRAIN_LENS = 24, (64, 256)


def build(name: str) -> torch.nn.Module:
    max_seq_len = max(CONTEXTS) + 2 * WINDOW  # the Transformer's cache holds the whole rollout
    if name == "gru":
        return GRUTrajEncoder(TSTEP_DIM, max_seq_len, d_hidden=WIDTH, n_layers=LAYERS, d_output=WIDTH)
    if name == "transformer":
        return TransformerTrajEncoder(TSTEP_DIM, max_seq_len, d_model=WIDTH, n_layers=LAYERS)
    if name == "mamba":
        return MambaTrajEncoder(TSTEP_DIM, max_seq_len, d_model=WIDTH, n_layers=LAYERS, backend="torch")
    raise ValueError(name)


@torch.no_grad()
def rollout_ms(enc, steps: int) -> list[float]:
    """Per-step wall time (ms) of one rollout of `steps` steps from an empty context."""
    enc.eval()
    h = enc.init_hidden_state(ROLLOUT_ENVS, torch.device("cpu"))
    x = torch.randn(ROLLOUT_ENVS, 1, TSTEP_DIM)
    out = []
    for t in range(steps):
        tidx = torch.full((ROLLOUT_ENVS, 1, 1), t, dtype=torch.long)
        t0 = time.perf_counter()
        _, h = enc(x, tidx, h)
        h = enc.reset_hidden_state(h, torch.zeros(ROLLOUT_ENVS, dtype=torch.bool))
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def train_ms(enc, L: int, reps: int) -> float:
    enc.train()
    x = torch.randn(TRAIN_BATCH, L, TSTEP_DIM)
    tidx = torch.arange(L)[None, :, None].expand(TRAIN_BATCH, L, 1)
    times = []
    for r in range(reps + 1):  # the first is a warm-up
        enc.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        out, _ = enc(x, tidx)
        out.square().mean().backward()
        times.append((time.perf_counter() - t0) * 1e3)
    return min(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--reps", type=int, default=5, help="timed training iterations per window length")
    ap.add_argument("--encoders", default="gru,transformer,mamba")
    ap.add_argument("--smoke", action="store_true",
                    help="contexts 10 and 30, windows of 16, 1 rep: checks that the script works, its figures mean "
                         "nothing")
    args = ap.parse_args()
    global CONTEXTS, TRAIN_LENS
    if args.smoke:
        CONTEXTS, TRAIN_LENS, args.reps = (10, 30), (16,), 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    warnings.simplefilter("ignore")
    rows = []
    for name in args.encoders.split(","):
        enc = build(name)
        row = {"encoder": name, "params": sum(p.numel() for p in enc.parameters()), "threads": args.threads}
        rollout_ms(enc, 2 * WINDOW)  # warm-up
        per_step = rollout_ms(enc, max(CONTEXTS) + WINDOW)
        for c in CONTEXTS:
            row[f"step_ms@{c}"] = round(min(per_step[c - 1 : c - 1 + WINDOW]), 3)
        for L in TRAIN_LENS:
            row[f"train_ms@L{L}"] = round(train_ms(enc, L, args.reps), 1)
        rows.append(row)
        print(f"... {name} done", flush=True)

    cols = ["encoder", "params"] + [f"step_ms@{c}" for c in CONTEXTS] + [f"train_ms@L{L}" for L in TRAIN_LENS]
    print(f"\nrollout: ms/step, {ROLLOUT_ENVS} envs; train: ms per fwd+bwd, batch {TRAIN_BATCH}; "
          f"d_model {WIDTH}, {LAYERS} layers, {args.threads} threads, torch {torch.__version__}")
    print(" | ".join(f"{c:>13}" for c in cols))
    for row in rows:
        print(" | ".join(f"{row[c]:>13}" for c in cols))
    print()
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
