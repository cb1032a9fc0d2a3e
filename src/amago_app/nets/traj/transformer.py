"""Transformer memory: pre-norm layers with NormFormer norms, σReparam linears, absolute time positions.

`attention` picks the kernel (sdpa | vanilla | flash | flex | auto) and `attn_mask` the pattern (causal |
sliding_window | sliding_sink); see `amago_app.nets.traj.attention` for the supported combinations.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from amago_app.nets.common import activation as make_activation
from amago_app.nets.common import norm as make_norm
from amago_app.nets.traj.attention import (AttentionBackend, CausalSelfAttention, KVCache, MaskSpec, StepIndex,
                                           make_backend)
from amago_app.nets.traj.positions import PositionalEmbedding
from amago_app.nets.traj.sigma_reparam import linear
from amago_app.nets.traj.base import TrajEncoder


class TransformerLayer(nn.Module):
    """h += LN2(Attn(LN1(h))); h += drop(W2 LN4(act(W1 LN3(h)))). LN2/LN4 are the NormFormer extras."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout_ff: float, dropout_attn: float,
                 dropout_qkv: float, activation: str, norm: str, sigma_reparam: bool, normformer_norms: bool,
                 head_scaling: bool, rope: bool, backend: AttentionBackend | None = None, qkv_gain: float = 1.0):
        super().__init__()
        self.attn = CausalSelfAttention(d_model, n_heads, dropout_attn, dropout_qkv, sigma_reparam, head_scaling, rope,
                                        backend, qkv_gain)
        self.ln1, self.ln3 = make_norm(norm, d_model), make_norm(norm, d_model)
        self.ln2 = make_norm(norm, d_model) if normformer_norms else nn.Identity()
        self.ln4 = make_norm(norm, d_ff) if normformer_norms else nn.Identity()
        self.w1 = linear(d_model, d_ff, bias=True, sigma_reparam=sigma_reparam)
        self.w2 = linear(d_ff, d_model, bias=True, sigma_reparam=sigma_reparam)
        self.act = make_activation(activation)
        self.drop = nn.Dropout(dropout_ff)

    def _ff(self, h):
        return self.drop(self.w2(self.ln4(self.act(self.w1(self.ln3(h))))))

    def forward(self, h, positions):
        h = h + self.ln2(self.attn(self.ln1(h), positions))
        return h + self._ff(h)

    def step(self, h, positions, cache, layer, idx):
        h = h + self.ln2(self.attn.step(self.ln1(h), positions, cache, layer, idx))
        return h + self._ff(h)


class TransformerTrajEncoder(TrajEncoder):
    """Causal Transformer over timesteps with a ring-buffer KV cache for rollouts.

    attention: sdpa | vanilla | flash | flex | auto. attn_mask: causal | sliding_window | sliding_sink, with
    window_size (int or flash-style (left, 0)), sink_size, sink_bias, logit_clip. flex_compile: compile the
    flex kernel (None = on CUDA only). Bad values and unsupported combinations raise ValueError.
    """

    def __init__(
        self,
        tstep_dim: int,
        max_seq_len: int,
        d_model: int = 256,
        n_heads: int = 8,
        d_ff: int | None = None,
        n_layers: int = 3,
        dropout_ff: float = 0.05,
        dropout_emb: float = 0.05,
        dropout_attn: float = 0.0,
        dropout_qkv: float = 0.0,
        activation: str = "leaky_relu",
        norm: str = "layer",
        pos_emb: str = "fixed",
        max_time_idx: int | None = None,
        sigma_reparam: bool = True,
        normformer_norms: bool = True,
        head_scaling: bool = True,
        qkv_gain: float = 1.0,
        attention: str = "sdpa",
        attn_mask: str = "causal",
        window_size: int | tuple[int, int] | None = None,
        sink_size: int = 0,
        sink_bias: float = 0.0,
        logit_clip: float = 0.0,
        flex_compile: bool | None = None,
    ):
        super().__init__(tstep_dim, max_seq_len)
        if not qkv_gain > 0:  # also catches NaN
            raise ValueError(f"qkv_gain={qkv_gain} must be > 0")
        if qkv_gain != 1.0 and not sigma_reparam:  # plain projections have no scale to start: it would do nothing
            raise ValueError(f"qkv_gain={qkv_gain} needs sigma_reparam=true (it is the starting scale of the "
                             "sigma-reparameterized projection); set qkv_gain=1.0 or sigma_reparam=true")
        d_ff = d_ff or 4 * d_model
        self.mask = MaskSpec.build(attn_mask, window_size, sink_size, sink_bias, logit_clip)
        self.backend = make_backend(attention, self.mask, dropout_attn, flex_compile)
        self.d_model, self.n_heads, self.n_layers = d_model, n_heads, n_layers
        self.inp = nn.Linear(tstep_dim, d_model)
        self.pos = PositionalEmbedding(pos_emb, d_model, max_time_idx)
        self.drop_emb = nn.Dropout(dropout_emb)
        self.layers = nn.ModuleList(
            TransformerLayer(d_model, n_heads, d_ff, dropout_ff, dropout_attn, dropout_qkv, activation, norm,
                             sigma_reparam, normformer_norms, head_scaling, rope=pos_emb == "rope",
                             backend=self.backend, qkv_gain=qkv_gain)
            for _ in range(n_layers)
        )
        self.final_norm = make_norm(norm, d_model)
        self._compiled_step = None  # compile_rollout_step()

    @property
    def emb_dim(self) -> int:
        return self.d_model

    @property
    def attention_backend(self) -> str:
        """The backend in use after fallbacks (flash may still hand single calls to its fallback)."""
        return self.backend.name

    def _embed(self, seq, positions):
        h = self.inp(seq)
        pe = self.pos(positions)
        return self.drop_emb(h if pe is None else h + pe.to(h.dtype))

    def init_hidden_state(self, batch_size, device):
        return KVCache.empty(self.n_layers, batch_size, self.n_heads, self.max_seq_len,
                             self.d_model // self.n_heads, device)

    def reset_hidden_state(self, hidden_state, dones):
        return None if hidden_state is None else hidden_state.reset(dones)

    def rollout_state_bytes(self, batch_size: int) -> int:
        # KVCache: keys and values of every layer (fp32 at most) and the step index of each slot (int64)
        return batch_size * self.max_seq_len * (2 * self.n_layers * self.d_model * 4 + 8)

    def forward(self, seq, time_idxs, hidden_state: KVCache | None = None):
        positions = time_idxs[..., 0]
        if hidden_state is None:
            h = self._embed(seq, positions)
            for layer in self.layers:
                h = layer(h, positions)
            return self.final_norm(h), None
        outs = [self._step(seq[:, t : t + 1], positions[:, t : t + 1], hidden_state) for t in range(seq.shape[1])]
        return torch.cat(outs, dim=1), hidden_state

    def _step(self, seq, positions, cache: KVCache):
        # compiled for acting: traced in eval mode without gradient; any other call runs eagerly (no recompilation)
        if self._compiled_step is not None and not (self.training or torch.is_grad_enabled()):
            # the K/V buffers are allocated here, not inside the compiled code (a None -> tensor change would
            # compile a second variant for the first step)
            dev = seq.device.type
            dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else seq.dtype
            for i in range(self.n_layers):
                cache.buffers(i, dtype, self.backend.heads_first)
            h = self._compiled_step(seq, positions, cache, True)
        else:
            h = self._step_body(seq, positions, cache, False)
        cache.count = cache.count + 1
        return h

    def _step_body(self, seq, positions, cache: KVCache, full_width: bool):
        idx = StepIndex.advance(cache, self.backend, full_width)  # ring slot, valid prefix, mask positions
        h = self._embed(seq, positions)
        for i, layer in enumerate(self.layers):
            h = layer.step(h, positions, cache, i, idx)
        return self.final_norm(h)

    def __getstate__(self):
        # a copy (copy.deepcopy: the overlap's acting agent) must not share the compiled step, which is bound to
        # this module's parameters; it acts eagerly until compiled itself
        return {**super().__getstate__(), "_compiled_step": None}

    #: backends whose rollout step compiles into one graph (flash-attn and flex keep kernels of their own)
    COMPILED_STEP_BACKENDS = ("sdpa", "vanilla")

    def compile_rollout_step(self, batch_size: int, device: torch.device) -> bool:
        """Compile the rollout step (embedding, every layer's K/V write and attention over all ring slots, final
        norm) into one inductor graph. On CPU with the C++ wrapper: a step of the reference model (d_model 128,
        2 layers, 8 rows) is dominated by the dispatch of hundreds of small ops, which the compiled code skips."""
        if self.backend.name not in self.COMPILED_STEP_BACKENDS:
            return False
        options = {"cpp_wrapper": True} if device.type == "cpu" else None
        self._compiled_step = torch.compile(self._step_body, dynamic=False, options=options)
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                cache = self.init_hidden_state(batch_size, device)
                seq = torch.zeros(batch_size, 1, self.tstep_dim, device=device)
                self(seq, torch.zeros(batch_size, 1, 1, dtype=torch.long, device=device), cache)
        except Exception:
            self._compiled_step = None
            raise
        finally:
            self.train(was_training)
        return True
