import pytest
import torch

from amago_app.agents.returns import nstep_targets


def brute_force(r, d, q, gammas, mask, n):
    """Direct loop over the definition (docs/design.md, "Losses")."""
    B, T, _ = r.shape
    y = torch.zeros(B, T, len(gammas))
    for b in range(B):
        real = int(mask[b].sum())
        for t in range(real):
            for gi, g in enumerate(gammas.tolist()):
                k = min(n, real - t)
                total, alive = 0.0, 1.0
                for i in range(k):
                    total += g**i * alive * float(r[b, t + i, 0])
                    alive *= 1.0 - float(d[b, t + i, 0])
                total += g**k * alive * float(q[b, t + k - 1, gi])
                y[b, t, gi] = total
    return y


@pytest.mark.parametrize("n", [1, 2, 3, 5, 20])
def test_matches_brute_force(n):
    torch.manual_seed(n)
    B, T = 5, 11
    gammas = torch.tensor([0.0, 0.5, 0.9, 0.999])
    r = torch.randn(B, T, 1)
    d = torch.rand(B, T, 1) < 0.2
    q = torch.randn(B, T, 4)
    mask = torch.ones(B, T, 1)
    mask[1, 7:] = 0
    mask[3, 1:] = 0
    r[mask == 0] = 4.0  # padding value: must not leak into targets
    d[mask == 0] = True
    y = nstep_targets(r, d, q, gammas, mask, n)
    torch.testing.assert_close(y * mask, brute_force(r, d, q, gammas, mask, n), atol=1e-5, rtol=1e-5)


def test_one_step_formula():
    r = torch.tensor([[[1.0], [2.0]]])
    d = torch.tensor([[[False], [True]]])
    q = torch.tensor([[[10.0], [20.0]]])
    y = nstep_targets(r, d, q, torch.tensor([0.9]), torch.ones(1, 2, 1), 1)
    torch.testing.assert_close(y[0, :, 0], torch.tensor([1 + 0.9 * 10, 2.0]))


def test_n_step_below_one_is_rejected():
    with pytest.raises(ValueError, match="n_step must be >= 1, got 0"):
        nstep_targets(torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), torch.ones(1), torch.ones(1, 1, 1), 0)
