"""A small Llama-shaped model in plain PyTorch (random weights), a reference runner for the
offload path: RMSNorm, rotary embeddings, grouped-query attention and a SwiGLU MLP, run on
packed ragged batches (prompts of different lengths in one forward, decode steps one token per
sequence).

Its attention is pluggable:
  - LocalAttention: in-process, each sequence's KV cache held in torch on the model's device
    (torch's scaled_dot_product_attention where present (torch >= 2.0), else matmul + softmax
    with a causal mask);
  - AttendAttention: through an attend server, one append_batch call per layer carrying the
    batch's new tokens packed; the KV caches live in the server.

    import attend, attend.llama as llama
    model = llama.LlamaModel(llama.LlamaConfig(layers=2, n_head=4, n_head_kv=2, head_dim=16))
    with attend.Client(target) as c:
        out = model.generate([[1, 2, 3], [4]], steps=8,
                             attention=llama.AttendAttention(c, kv_dtype="float32"))
    out.logits  # steps tensors [batch, vocab]

Needs torch (imported by this module; the rest of the package does not need it).
"""
import math
import os
import time

import torch
import torch.nn.functional as F

__all__ = ["LlamaConfig", "LlamaModel", "LocalAttention", "AttendAttention", "GenerateResult",
           "rotary"]

_HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class LlamaConfig:
    """Shape of the model. hidden defaults to n_head * head_dim, intermediate to about 8/3 of
    hidden (rounded up to a multiple of 16)."""

    def __init__(self, *, vocab_size=256, layers=2, n_head=4, n_head_kv=2, head_dim=16,
                 hidden=None, intermediate=None, rope_theta=10000.0, eps=1e-6, seed=0):
        if n_head % n_head_kv:
            raise ValueError("n_head_kv (%d) must divide n_head (%d)" % (n_head_kv, n_head))
        if head_dim % 2:
            raise ValueError("head_dim must be even (rotary embeddings)")
        self.vocab_size = vocab_size
        self.layers = layers
        self.n_head = n_head
        self.n_head_kv = n_head_kv
        self.head_dim = head_dim
        self.hidden = hidden or n_head * head_dim
        self.intermediate = intermediate or -(-(8 * self.hidden // 3) // 16) * 16
        self.rope_theta = rope_theta
        self.eps = eps
        self.seed = seed

    def __repr__(self):
        return "LlamaConfig(%s)" % ", ".join("%s=%r" % kv for kv in sorted(vars(self).items()))


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x32).to(x.dtype)


def rotary(x, positions, theta):
    """Rotary embedding (Llama's rotate-half layout) of x [n, heads, head_dim] at positions [n]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = positions.to(x.device, torch.float32)[:, None] * inv[None, :]  # [n, d/2]
    emb = torch.cat([angles, angles], -1)[:, None, :]  # [n, 1, d]
    cos, sin = emb.cos(), emb.sin()
    x32 = x.float()
    half = torch.cat([-x32[..., d // 2:], x32[..., :d // 2]], -1)
    return (x32 * cos + half * sin).to(x.dtype)


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn_norm = RMSNorm(c.hidden, c.eps)
        self.wq = torch.nn.Linear(c.hidden, c.n_head * c.head_dim, bias=False)
        self.wk = torch.nn.Linear(c.hidden, c.n_head_kv * c.head_dim, bias=False)
        self.wv = torch.nn.Linear(c.hidden, c.n_head_kv * c.head_dim, bias=False)
        self.wo = torch.nn.Linear(c.n_head * c.head_dim, c.hidden, bias=False)
        self.mlp_norm = RMSNorm(c.hidden, c.eps)
        self.w_gate = torch.nn.Linear(c.hidden, c.intermediate, bias=False)
        self.w_up = torch.nn.Linear(c.hidden, c.intermediate, bias=False)
        self.w_down = torch.nn.Linear(c.intermediate, c.hidden, bias=False)


class GenerateResult:
    """What generate returns. logits: `steps` float32 CPU tensors [batch, vocab] (logits[0] from
    the prompt's last token, logits[t] after the t-th generated token was fed); tokens: the
    tokens fed after the prompt (teacher-forced or argmax), steps - 1 lists of [batch] (the
    last logits' argmax is not fed, so not listed); prompt_seconds: the prompt's
    forward; step_seconds: each decode forward's; attention_seconds / server_seconds /
    attention_calls: what the attention backend spent (see its fields), over the whole run."""

    def __init__(self):
        self.logits = []
        self.tokens = []
        self.prompt_seconds = 0.0
        self.step_seconds = []
        self.attention_seconds = 0.0
        self.prompt_attention_seconds = 0.0
        self.server_seconds = 0.0
        self.attention_calls = 0


class LlamaModel(torch.nn.Module):
    """The model, random weights from config.seed (N(0, 0.02) projections, scaled so that
    activations stay O(1) over a few layers)."""

    def __init__(self, config, device="cpu", dtype=torch.float32):
        super().__init__()
        self.config = c = config
        generator = torch.Generator().manual_seed(c.seed)
        self.embed = torch.nn.Embedding(c.vocab_size, c.hidden)
        self.blocks = torch.nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, c.eps)
        self.lm_head = torch.nn.Linear(c.hidden, c.vocab_size, bias=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator))
                elif name == "embed.weight":
                    p.copy_(torch.randn(p.shape, generator=generator))
                else:
                    p.copy_(torch.randn(p.shape, generator=generator) / math.sqrt(p.shape[1]))
        self.to(device=device, dtype=dtype)

    @property
    def device(self):
        return self.embed.weight.device

    def forward(self, tokens, positions, counts, attention, overlap=False):
        """Logits [n, vocab] of the packed tokens [n] at positions [n]: sequence i's rows are
        the counts[i] after the previous sequences'. attention.start(layer, q, k, v, counts,
        first) appends k/v to the caches of sequences first, first + 1, ... and returns a
        handle whose result() is the causal attention [n, n_head, head_dim].

        overlap: run the batch as two halves (sequences [0, m) and [m, batch)) pipelined so
        that one half's attention call is always in flight while the other half's dense layers
        run: layer L's attention of half 0 overlaps half 1's projections, and half 1's
        overlaps half 0's output projection, MLP and next layer's projections. The same
        computation row by row as without overlap (the last bits may differ where a matmul
        blocks a half's rows otherwise than the whole batch's)."""
        x = self.embed(tokens.to(self.device))
        if not overlap or len(counts) < 2:
            for layer, b in enumerate(self.blocks):
                o = self._start(b, layer, x, positions, counts, 0, attention).result()
                x = self._finish(b, x, o)
            return self.lm_head(self.norm(x)).float()
        m = (len(counts) + 1) // 2
        cut = sum(counts[:m])
        parts = [(x[:cut], positions[:cut], counts[:m], 0),
                 (x[cut:], positions[cut:], counts[m:], m)]
        xs = [p[0] for p in parts]
        pending = [None, None]
        try:
            for layer, b in enumerate(self.blocks):
                for i, (_, pos, part_counts, first) in enumerate(parts):
                    if pending[i] is not None:
                        # The previous layer's output of this half; the other half's call is
                        # still in flight meanwhile.
                        done, pending[i] = pending[i], None
                        xs[i] = self._finish(self.blocks[layer - 1], xs[i], done.result())
                    pending[i] = self._start(b, layer, xs[i], pos, part_counts, first, attention)
            for i in range(2):
                done, pending[i] = pending[i], None
                xs[i] = self._finish(self.blocks[-1], xs[i], done.result())
        except BaseException:
            # No call is left running unobserved behind a failed forward.
            for p in pending:
                if p is not None and hasattr(p, "cancel"):
                    p.cancel()
            raise
        return self.lm_head(self.norm(torch.cat(xs))).float()

    def _start(self, b, layer, x, positions, counts, first, attention):
        """Block b's projections of x and the start of its attention call."""
        c = self.config
        n = x.shape[0]
        h = b.attn_norm(x)
        q = rotary(b.wq(h).view(n, c.n_head, c.head_dim), positions, c.rope_theta)
        k = rotary(b.wk(h).view(n, c.n_head_kv, c.head_dim), positions, c.rope_theta)
        v = b.wv(h).view(n, c.n_head_kv, c.head_dim)
        return attention.start(layer, q.contiguous(), k.contiguous(), v.contiguous(), counts,
                               first)

    def _finish(self, b, x, o):
        """Block b's output projection of the attention o, residual, and MLP."""
        c = self.config
        x = x + b.wo(o.reshape(x.shape[0], c.n_head * c.head_dim).to(x.dtype))
        h = b.mlp_norm(x)
        return x + b.w_down(F.silu(b.w_gate(h)) * b.w_up(h))

    @torch.no_grad()
    def generate(self, prompt_token_lists, steps, teacher_forced_tokens=None, attention=None,
                 overlap=False):
        """Runs the prompts (one packed forward; lists of different lengths) then steps - 1
        decode forwards (one token per sequence each), and returns a GenerateResult with
        `steps` logits. teacher_forced_tokens[i][t]: the t-th token fed to sequence i (else the
        argmax). attention: a LocalAttention (the default) or AttendAttention; its sequences
        are created here and released at the end, also when a step fails. overlap: every
        forward runs as two pipelined halves (see forward); it pays where the attention runs
        elsewhere than the dense layers (AttendAttention with the model on an accelerator)."""
        attention = attention if attention is not None else LocalAttention()
        prompts = [list(p) for p in prompt_token_lists]
        if not prompts:
            raise ValueError("generate: no prompts; give at least one")
        if any(len(p) < 1 for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError("generate: steps %r; the logits to make, at least 1" % (steps,))
        vocab = self.config.vocab_size
        if any(not 0 <= int(t) < vocab for p in prompts for t in p):
            raise ValueError("generate: a prompt token is outside the vocabulary [0, %d)" % vocab)
        if teacher_forced_tokens is not None:
            if len(teacher_forced_tokens) != len(prompts) or any(
                    len(row) < steps - 1 for row in teacher_forced_tokens):
                raise ValueError("generate: teacher_forced_tokens needs %d rows of at least %d "
                                 "tokens (one per decode step)" % (len(prompts), steps - 1))
            if any(not 0 <= int(t) < vocab for row in teacher_forced_tokens
                   for t in row[:steps - 1]):
                raise ValueError("generate: a teacher-forced token is outside the vocabulary "
                                 "[0, %d)" % vocab)
        batch = len(prompts)
        result = GenerateResult()
        sync = _sync_for(self.device)
        attention.begin(self, batch)
        try:
            lengths = [len(p) for p in prompts]
            tokens = torch.tensor([t for p in prompts for t in p], dtype=torch.long)
            positions = torch.cat([torch.arange(n) for n in lengths])
            last = torch.tensor(lengths).cumsum(0) - 1
            sync()
            start = time.perf_counter()
            logits = self.forward(tokens, positions, lengths, attention,
                                  overlap)[last.to(self.device)]
            sync()
            result.prompt_seconds = time.perf_counter() - start
            result.prompt_attention_seconds = attention.seconds
            result.logits.append(logits.cpu())
            for t in range(steps - 1):
                if teacher_forced_tokens is not None:
                    chosen = [int(teacher_forced_tokens[i][t]) for i in range(batch)]
                else:
                    chosen = logits.argmax(-1).tolist()
                result.tokens.append(chosen)
                positions = torch.tensor(lengths) + t
                sync()
                start = time.perf_counter()
                logits = self.forward(torch.tensor(chosen), positions, [1] * batch, attention,
                                      overlap)
                sync()
                result.step_seconds.append(time.perf_counter() - start)
                result.logits.append(logits.cpu())
        finally:
            attention.release()
        result.attention_seconds = attention.seconds
        result.server_seconds = attention.server_seconds
        result.attention_calls = attention.calls
        return result


def _sync_for(device):
    if torch.device(device).type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def _round_bf16(x):
    return x.to(torch.bfloat16).to(x.dtype)


class LocalAttention:
    """In-process attention with the KV caches in torch on the model's device (float32 math).
    kv_dtype "bfloat16" rounds cached k/v to bfloat16 as attend's bfloat16 storage does
    (default: keep them as they come). seconds: wall time inside the calls (device-synced);
    server_seconds is 0."""

    def __init__(self, kv_dtype=None):
        self.kv_dtype = kv_dtype
        self.seconds = 0.0
        self.server_seconds = 0.0
        self.calls = 0
        self._cache = None

    def begin(self, model, batch):
        self._config = model.config
        self._sync = _sync_for(model.device)
        self._cache = [[None] * batch for _ in range(model.config.layers)]  # (k, v) per seq

    def release(self):
        self._cache = None

    def start(self, layer, q, k, v, counts, first=0):
        """Computes at once (on the model's device, in this thread) and returns a Done."""
        return Done(self(layer, q, k, v, counts, first))

    def __call__(self, layer, q, k, v, counts, first=0):
        self._sync()
        start = time.perf_counter()
        c = self._config
        if self.kv_dtype in ("bfloat16", "bf16"):
            k, v = _round_bf16(k), _round_bf16(v)
        group = c.n_head // c.n_head_kv
        scale = 1.0 / math.sqrt(c.head_dim)
        outputs, row = [], 0
        caches = self._cache[layer]
        for i, n in enumerate(counts, start=first):
            kn, vn = k[row:row + n], v[row:row + n]
            if caches[i] is not None:
                kn, vn = torch.cat([caches[i][0], kn]), torch.cat([caches[i][1], vn])
            caches[i] = (kn, vn)
            outputs.append(_attention(q[row:row + n], kn, vn, group, scale))
            row += n
        out = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
        self._sync()
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return out


class Done:
    """A result already computed, with the handle interface of a call in flight."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


def _attention(q, k, v, group, scale):
    """Causal attention of q [n, H, d] over k/v [T, G, d], the queries being the last n of the
    T positions; query head h reads kv head h // group. float32 math."""
    n, t = q.shape[0], k.shape[0]
    qh = q.float().transpose(0, 1)  # [H, n, d]
    kh = k.float().repeat_interleave(group, 1).transpose(0, 1)  # [H, T, d]
    vh = v.float().repeat_interleave(group, 1).transpose(0, 1)
    allowed = (torch.arange(t, device=q.device)[None, :]
               <= torch.arange(t - n, t, device=q.device)[:, None])  # [n, T]
    if _HAS_SDPA:
        # The default scale, 1/sqrt(head_dim), is the one used here.
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed)
    else:
        scores = torch.matmul(qh, kh.transpose(1, 2)) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.matmul(torch.softmax(scores, -1), vh)
    return out.transpose(0, 1).to(q.dtype)  # [n, H, d]


class AttendAttention:
    """Attention through an attend server: begin() creates one sequence per batch row
    ("<prefix>-<i>", shaped like the model, kv_dtype storage), each call is one append_batch
    with the batch's new tokens packed, release() releases them all (errors other than NotFound
    are raised after every release was tried). seconds: wall time inside the calls (what the
    client waits); server_seconds: the responses' ComputeStats.compute_seconds summed."""

    def __init__(self, client, kv_dtype="bfloat16", prefix=None, precision=None):
        self.client = client
        self.kv_dtype = kv_dtype
        self.prefix = prefix or "llama-" + os.urandom(4).hex()
        self.precision = precision
        self.seconds = 0.0
        self.server_seconds = 0.0
        self.calls = 0
        self.ids = []

    def begin(self, model, batch):
        c = model.config
        self._sync = _sync_for(model.device)
        self.ids = []
        try:
            for i in range(batch):
                sid = "%s-%d" % (self.prefix, i)
                self.client.create_sequence(sid, layers=c.layers, n_head=c.n_head,
                                            n_head_kv=c.n_head_kv, head_dim=c.head_dim,
                                            kv_dtype=self.kv_dtype)
                self.ids.append(sid)
        except BaseException:
            self.release()
            raise

    def release(self):
        from . import errors
        ids, self.ids = self.ids, []
        failure = None
        for sid in ids:
            try:
                self.client.release(sid)
            except errors.NotFound:
                pass
            except Exception as e:  # noqa: BLE001  (the others are still released)
                failure = failure or e
        if failure is not None:
            raise failure

    def __call__(self, layer, q, k, v, counts, first=0):
        return self.start(layer, q, k, v, counts, first).result()

    def start(self, layer, q, k, v, counts, first=0):
        """Starts the append_batch of sequences first, first + 1, ... (append_batch_async) and
        returns a handle whose result() is the output. seconds counts the time spent in start
        and in result(): what the model waited, which overlap hides."""
        self._sync()
        begin = time.perf_counter()
        pending = self.client.append_batch_async(layer, self.ids[first:first + len(counts)], q,
                                                 k, v, counts=counts, precision=self.precision)
        self.seconds += time.perf_counter() - begin
        return _AttendCall(self, pending)


class _AttendCall:
    __slots__ = ("owner", "pending")

    def __init__(self, owner, pending):
        self.owner, self.pending = owner, pending

    def cancel(self):
        return self.pending.cancel()

    def result(self):
        begin = time.perf_counter()
        r = self.pending.result()
        owner = self.owner
        owner.seconds += time.perf_counter() - begin
        owner.server_seconds += r.stats.compute_seconds
        owner.calls += r.calls
        return r.output
