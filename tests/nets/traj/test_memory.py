"""Every trajectory encoder: step-by-step rollouts equal the full-sequence forward."""

import functools

import pytest
import torch

from amago_app.nets.traj.base import IdentityTrajEncoder
from amago_app.nets.traj.ff import FFTrajEncoder
from amago_app.nets.traj.gru import GRUTrajEncoder
from amago_app.nets.traj.transformer import TransformerTrajEncoder
from amago_app.nets.tstep import InputNorm

ENCODERS = {
    "identity": IdentityTrajEncoder,
    "ff": functools.partial(FFTrajEncoder, d_model=32),
    "gru": functools.partial(GRUTrajEncoder, d_hidden=32, d_output=32),
    "transformer": functools.partial(TransformerTrajEncoder, d_model=32, n_heads=4, n_layers=2),
}


@pytest.mark.parametrize("name", list(ENCODERS))
def test_step_by_step_equals_full_forward_with_resets(name):
    torch.manual_seed(0)
    enc = ENCODERS[name](tstep_dim=8, max_seq_len=16).eval()
    N, L = 3, 12
    x = torch.randn(N, L, 8)
    reset_at = [None, 4, 7]  # row i restarts its episode at this step
    times = torch.zeros(N, L, 1, dtype=torch.long)
    for i, r in enumerate(reset_at):
        t = torch.arange(L) if r is None else torch.cat([torch.arange(r), torch.arange(L - r)])
        times[i, :, 0] = t + 3  # absolute in-episode positions need not start at the window start
        if r is not None:
            times[i, r:, 0] -= 3
    h = enc.init_hidden_state(N, "cpu")
    outs = []
    for t in range(L):
        dones = torch.tensor([r is not None and t == r for r in reset_at])
        h = enc.reset_hidden_state(h, dones)
        o, h = enc(x[:, t : t + 1], times[:, t : t + 1], h)
        outs.append(o)
    stepped = torch.cat(outs, 1)
    for i, r in enumerate(reset_at):
        start = 0 if r is None else r
        full, _ = enc(x[i : i + 1, start:], times[i : i + 1, start:])
        torch.testing.assert_close(stepped[i : i + 1, start:], full, atol=2e-5, rtol=1e-4)


def test_transformer_training_outputs_are_causal():
    enc = TransformerTrajEncoder(8, 10, d_model=32, n_heads=4, n_layers=2).eval()
    x = torch.randn(1, 10, 8)
    t = torch.arange(10)[None, :, None]
    a, _ = enc(x, t)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(1, 4, 8)
    b, _ = enc(x2, t)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_input_norm_statistics_skip_padding():
    norm = InputNorm(2, beta=0.5)
    x = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [4.0, 4.0]]])
    real = torch.tensor([[True, True, False]])
    norm.update(x, real)
    # t=2: beta_t = 0.5 / (1 - 0.25) = 2/3
    torch.testing.assert_close(norm.mu, torch.tensor([2.0, 3.0]) * (2 / 3))
    torch.testing.assert_close(norm.nu, torch.tensor([1.0, 1.0]) / 3 + torch.tensor([5.0, 10.0]) * (2 / 3))


def test_input_norm_reuses_its_scale_only_while_the_statistics_are_unchanged():
    """Rollouts (no gradient) reuse sigma between calls; an update of the statistics, or a load of new ones,
    must show in the next call."""
    norm = InputNorm(3, beta=0.5)
    x = torch.randn(2, 4, 3) * 5

    def reference():
        sigma = torch.nan_to_num(torch.sqrt(norm.nu - norm.mu**2 + 1e-5)).clamp(1e-3, 1e6)
        return torch.where(sigma > 0.01, ((x - norm.mu) / sigma).clamp(-1e4, 1e4), x - norm.mu)

    with torch.no_grad():
        torch.testing.assert_close(norm(x), reference())
        norm.update(x, torch.ones(2, 4, dtype=torch.bool))
        torch.testing.assert_close(norm(x), reference())
        norm.load_state_dict({"mu": torch.ones(3), "nu": torch.full((3,), 5.0), "t": torch.tensor(3)})
        torch.testing.assert_close(norm(x), reference())
    assert norm(x).requires_grad is False and torch.equal(norm(x), reference())
