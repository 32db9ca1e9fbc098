#!/usr/bin/python3
"""attend.hf (attend as a transformers attention implementation) against the real attend-server.

transformers is not needed: a stand-in calls the attention function exactly as transformers'
LlamaAttention.forward does (query/key/value [batch, heads, len, head_dim] after rotary
embeddings, the 4-D mask [batch, 1, q_len, kv_len] that transformers builds from a 2-D padding
mask, scaling=module.scaling, dropout=0.0, layer_idx on the module, position_ids in kwargs, the
output reshaped from [batch, q_len, heads, head_dim]) over a prefill then decode steps, and
compares it with transformers' eager attention (copied here) computed in-process. When
transformers is installed a tiny LlamaForCausalLM also runs through it; otherwise that test is
skipped saying so.

    PYTHONPATH=build/python tests/client/python/hf_integration_test.py --server build/server/attend-server
"""
import argparse
import contextlib
import re
import signal
import subprocess
import sys
import tempfile
import types
import unittest
from unittest import mock

try:
    import torch
except ImportError:  # the whole test needs torch: CTest counts exit status 77 as skipped
    print("skipped: torch is not installed")
    sys.exit(77)

import attend
import attend.hf

ARGS = None
MIN = torch.finfo(torch.float32).min


class Server:
    """attend-server on a free loopback port (no metrics port), stopped with SIGTERM."""

    def __init__(self, *flags):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [ARGS.server, "--address=127.0.0.1:0", "--metrics_address="] + list(flags),
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        match = re.search(r"listening on [\d.]+:(\d+)", line)
        if not match:
            self.proc.kill()
            self.log.seek(0)
            raise RuntimeError("server did not start: %r %s" % (line, self.log.read()))
        self.target = "127.0.0.1:%s" % match.group(1)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=30)
        self.log.close()


# --- transformers' own pieces, as in transformers/models/llama/modeling_llama.py ------------

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def rotary_cos_sin(position_ids, head_dim, theta=10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = position_ids[:, :, None].float() * inv[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(hidden_states, n_rep):
    batch, kv_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, kv_heads * n_rep, slen, head_dim)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0,
                            **kwargs):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(
        query.dtype)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


class DynamicCache:
    """transformers' DynamicCache's update(): keeps every layer's keys and values."""

    def __init__(self):
        self.k, self.v = {}, {}

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        if layer_idx in self.k:
            key_states = torch.cat([self.k[layer_idx], key_states], dim=-2)
            value_states = torch.cat([self.v[layer_idx], value_states], dim=-2)
        self.k[layer_idx], self.v[layer_idx] = key_states, value_states
        return key_states, value_states

    def get_seq_length(self, layer_idx=0):
        return self.k[layer_idx].shape[-2] if layer_idx in self.k else 0

    def get_mask_sizes(self, q_length, layer_idx=0):
        return self.get_seq_length(layer_idx) + q_length, 0


class StaticCache:
    """transformers' StaticCache's update(): keys and values written into preallocated zeros
    of max_len positions, the whole buffer returned; reset() zeroes it."""

    def __init__(self, max_len):
        self.max_len, self.k, self.v, self.seen = max_len, {}, {}, {}

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        if layer_idx not in self.k:
            shape = key_states.shape[:2] + (self.max_len, key_states.shape[3])
            self.k[layer_idx], self.v[layer_idx] = torch.zeros(shape), torch.zeros(shape)
            self.seen[layer_idx] = 0
        at, n = self.seen[layer_idx], key_states.shape[2]
        self.k[layer_idx][:, :, at:at + n] = key_states
        self.v[layer_idx][:, :, at:at + n] = value_states
        self.seen[layer_idx] = at + n
        return self.k[layer_idx], self.v[layer_idx]

    def reset(self):
        for layer in self.k:
            self.k[layer].zero_()
            self.v[layer].zero_()
            self.seen[layer] = 0


def causal_mask_4d(mask_2d, q_len, past, kind):
    """transformers' _prepare_4d_causal_attention_mask_with_cache_position: [batch, 1, q_len,
    past + q_len], 0 where attended and MIN (kind "min"), -inf ("inf") or False ("bool")
    elsewhere."""
    target = past + q_len
    cache_position = torch.arange(past, target)
    causal = torch.full((q_len, target), MIN).triu(1)
    causal *= torch.arange(target) > cache_position.reshape(-1, 1)
    causal = causal[None, None].expand(mask_2d.shape[0], 1, -1, -1).clone()
    padding = causal + mask_2d[:, None, None, :target].float()
    causal = causal.masked_fill(padding == 0, MIN)
    if kind == "bool":
        return causal == 0
    if kind == "inf":
        return causal.masked_fill(causal == MIN, float("-inf"))
    if kind == "-1e4":
        return causal.masked_fill(causal == MIN, -1e4)
    return causal


# --- transformers 5's mask registry and Cache, as attend.hf meets them -----------------------

class GeneralInterface:
    """transformers.utils.generic.GeneralInterface: a class-wide mapping that register()
    writes, and per-instance overrides."""
    _global_mapping = {}

    def __init__(self):
        self._local_mapping = {}

    def __getitem__(self, key):
        if key in self._local_mapping:
            return self._local_mapping[key]
        return self._global_mapping[key]

    @classmethod
    def register(cls, key, value):
        cls._global_mapping.update({key: value})


def sdpa_mask(batch_size, q_offset, q_length, kv_length, padding_mask=None,
              allow_is_causal_skip=True):
    """masking_utils.sdpa_mask's result: None where only the causal triangle is masked and
    torch can be told is_causal (no padding, and one query or as many queries as keys);
    otherwise bool [batch, 1, q_length, kv_length], True = attend, fully masked rows (padded
    queries) turned all True as older torch needs."""
    if padding_mask is None:
        padding_mask = torch.ones(batch_size, kv_length, dtype=torch.bool)
    if allow_is_causal_skip and bool(padding_mask.all()) and \
            (q_length == 1 or kv_length == q_length):
        return None
    assert kv_length == q_offset + q_length, (kv_length, q_offset, q_length)
    mask = causal_mask_4d(padding_mask.long(), q_length, q_offset, "bool")
    return mask | ~mask.any(-1, keepdim=True)


def create_causal_mask(config, input_embeds, attention_mask, past_key_values, layer_idx=0):
    """masking_utils.create_causal_mask in transformers 5 (_preprocess_mask_arguments): no mask
    at all for an implementation missing from the mask registry; otherwise the registered
    mask function over the lengths the cache reports (get_mask_sizes(q_length: int, layer))."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    impl = config._attn_implementation
    if impl not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        return None
    q_length = input_embeds.shape[1]
    if past_key_values is not None:
        q_offset = past_key_values.get_seq_length()
        kv_length, kv_offset = past_key_values.get_mask_sizes(q_length, layer_idx)
        assert kv_offset == 0
    else:
        q_offset, kv_length = 0, q_length
    allow_skip = not getattr(past_key_values, "is_compileable", False)
    return ALL_MASK_ATTENTION_FUNCTIONS[impl](
        input_embeds.shape[0], q_offset, q_length, kv_length,
        padding_mask=None if attention_mask is None else attention_mask.bool(),
        allow_is_causal_skip=allow_skip)


def transformers5_modules(masking=True):
    """sys.modules entries for a transformers 5 as far as attend.hf uses it: AttentionInterface,
    the mask registry (without `masking`: transformers 4.48-4.52, which had none) and a Cache
    whose constructor wants its layers, and whose row operations walk them."""

    class AttentionInterface(GeneralInterface):
        _global_mapping = {"eager": eager_attention_forward}

    class AttentionMaskInterface(GeneralInterface):
        _global_mapping = {"sdpa": sdpa_mask}

    class Cache:
        def __init__(self, layers=None, layer_class_to_replicate=None):
            if (layers is None) == (layer_class_to_replicate is None):
                raise ValueError("You should provide exactly one of layers or "
                                 "layer_class_to_replicate to initialize a Cache.")
            self.layers = layers if layers is not None else []

        @property
        def is_compileable(self):
            return True

        def reorder_cache(self, beam_idx):
            for layer in self.layers:
                layer.reorder_cache(beam_idx)

        def crop(self, max_length):
            for layer in self.layers:
                layer.crop(max_length)

        def batch_select_indices(self, indices):
            for layer in self.layers:
                layer.batch_select_indices(indices)

        def batch_repeat_interleave(self, repeats):
            for layer in self.layers:
                layer.batch_repeat_interleave(repeats)

    top = types.ModuleType("transformers")
    top.__version__ = "5 (stand-in)"
    top.AttentionInterface = AttentionInterface
    cache_utils = types.ModuleType("transformers.cache_utils")
    cache_utils.Cache = Cache
    modules = {"transformers": top, "transformers.cache_utils": cache_utils}
    if masking:
        top.AttentionMaskInterface = AttentionMaskInterface
        masking_utils = types.ModuleType("transformers.masking_utils")
        masking_utils.ALL_MASK_ATTENTION_FUNCTIONS = AttentionMaskInterface()
        masking_utils.create_causal_mask = create_causal_mask
        modules["transformers.masking_utils"] = masking_utils
    return modules


class StandInAttention(torch.nn.Module):
    """LlamaAttention.forward's calling sequence, with its attention function pluggable."""

    def __init__(self, layer_idx, hidden, n_head, n_head_kv, head_dim, scaling=None):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = head_dim
        self.num_key_value_groups = n_head // n_head_kv
        self.scaling = scaling if scaling is not None else head_dim ** -0.5
        self.q_proj = torch.nn.Linear(hidden, n_head * head_dim, bias=False)
        self.k_proj = torch.nn.Linear(hidden, n_head_kv * head_dim, bias=False)
        self.v_proj = torch.nn.Linear(hidden, n_head_kv * head_dim, bias=False)
        self.o_proj = torch.nn.Linear(n_head * head_dim, hidden, bias=False)
        self.attention_interface = eager_attention_forward
        self.training = False

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_value=None,
                **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if past_key_value is not None:
            key_states, value_states = past_key_value.update(key_states, value_states,
                                                             self.layer_idx)
        attn_output, attn_weights = self.attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0, scaling=self.scaling, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights


class StandInModel(torch.nn.Module):
    """Layers of StandInAttention with residuals, run the way generate() runs a model."""

    def __init__(self, layers=2, hidden=64, n_head=4, n_head_kv=2, head_dim=16, scaling=None,
                 seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.head_dim = head_dim
        self.config = type("Config", (), {"num_hidden_layers": layers,
                                          "_attn_implementation": "eager"})()
        self.layers = torch.nn.ModuleList(
            StandInAttention(i, hidden, n_head, n_head_kv, head_dim, scaling)
            for i in range(layers))

    def use(self, fn):
        for layer in self.layers:
            layer.attention_interface = fn

    def forward(self, x, position_ids, attention_mask, cache):
        cos_sin = rotary_cos_sin(position_ids, self.head_dim)
        for layer in self.layers:
            out, _ = layer(x, cos_sin, attention_mask, cache, position_ids=position_ids)
            x = x + out
        return x

    @torch.no_grad()
    def run(self, prompt, mask_2d, steps, *, cache="dynamic", mask_kind="min",
            decode_mask_none=False):
        """Prefill of prompt [batch, len, hidden] (mask_2d [batch, len], 0 = padding), then
        `steps` decode steps of random inputs: what the layers added to each step's inputs
        ([batch, len, hidden], the residual stream less the inputs). cache: "dynamic", "none"
        or a cache object (session.cache()); mask_kind "transformers5": the mask that
        transformers 5's create_causal_mask builds for the configured implementation."""
        if cache == "dynamic":
            cache = DynamicCache()
        elif cache == "none":
            cache = None
        gen = torch.Generator().manual_seed(99)
        batch, length, hidden = prompt.shape
        mask_2d = mask_2d.clone()
        x, past, outs = prompt, 0, []
        for step in range(steps + 1):
            q_len = x.shape[1]
            position_ids = mask_2d.long().cumsum(-1) - 1
            position_ids.masked_fill_(mask_2d == 0, 1)
            position_ids = position_ids[:, -q_len:]
            if mask_kind == "transformers5":
                mask = create_causal_mask(self.config, x, mask_2d, cache)
            else:
                mask = causal_mask_4d(mask_2d, q_len, past, mask_kind)
            if decode_mask_none and step > 0:
                mask = None
            outs.append(self(x, position_ids, mask, cache) - x)  # what the layers added
            past += q_len
            x = torch.randn((batch, 1, hidden), generator=gen)
            mask_2d = torch.cat([mask_2d, torch.ones(batch, 1, dtype=mask_2d.dtype)], 1)
        return outs


class Integration(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--kv_cache_bytes=256MiB")
        cls.client = attend.Client(cls.server.target, deadline=60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def assertAllReleased(self):
        stats = self.client.stats()
        self.assertEqual((stats.sequences, stats.used_bytes), (0, 0))

    def compare(self, *, kv_dtype="float32", rtol=1e-4, batch=3, length=7, pads=None, steps=4,
                cache="dynamic", mask_kind="min", decode_mask_none=False, scaling=None):
        torch.manual_seed(1)
        model = StandInModel(scaling=scaling)
        prompt = torch.randn(batch, length, 64)
        mask_2d = torch.ones(batch, length, dtype=torch.long)
        for b, p in enumerate(pads or []):
            mask_2d[b, :p] = 0
        model.use(eager_attention_forward)
        want = model.run(prompt, mask_2d, steps)
        model.use(attend.hf.attention_forward)
        with attend.hf.offload(model, self.client, kv_dtype=kv_dtype) as session:
            if cache == "session":
                cache = session.cache()
            got = model.run(prompt, mask_2d, steps, cache=cache, mask_kind=mask_kind,
                            decode_mask_none=decode_mask_none)
            self.assertEqual(self.client.stats().sequences, batch)
            self.assertEqual(session.tokens(0), [length + steps - p for p in
                                                 (pads or [0] * batch)])
            self.assertEqual(session.calls, 2 * (steps + 1))
        self.assertAllReleased()
        valid = mask_2d.bool()
        for step, (w, g) in enumerate(zip(want, got)):
            rows = valid if step == 0 else torch.ones(batch, 1, dtype=torch.bool)
            scale = w[rows].abs().max()
            err = (w[rows] - g[rows]).abs().max() / scale
            self.assertLess(err, rtol, "step %d: max |difference| %.3g of max %.3g"
                            % (step, err * scale, scale))
            if pads:
                # Padded positions: zeros from attend's attention (the residual stays).
                self.assertTrue(torch.isfinite(g).all())
        return got

    def test_dynamic_cache_f32(self):
        self.compare()

    def test_noop_cache_inf_mask(self):
        # Only the new positions in key/value (attend keeps the cache), masks with -inf.
        self.compare(cache="none", mask_kind="inf")

    def test_bool_mask_and_none_in_decode(self):
        # sdpa-style masks: boolean in the prompt, None in decode steps (no padding).
        self.compare(cache="none", mask_kind="bool", decode_mask_none=True)

    def test_left_padding(self):
        self.compare(pads=[0, 3, 6], mask_kind="min")
        self.compare(pads=[2, 0, 5], cache="none", mask_kind="bool")
        self.compare(pads=[1, 4, 0], mask_kind="-1e4")  # as older models write masks

    def test_scaling_and_bf16(self):
        self.compare(scaling=0.1)
        # bfloat16 storage: k and v rounded to 8 significant bits (relative error up to 2^-9
        # each), attention computed in that precision; two layers of that on O(1) activations
        # stay within a few bf16 ulps (2^-8 ~ 0.004) of the float32 result: 2e-2 is ~5 ulps.
        self.compare(kv_dtype="bfloat16", rtol=2e-2)

    def test_refusals(self):
        model = StandInModel()
        model.use(attend.hf.attention_forward)
        prompt = torch.randn(2, 5, 64)
        right = torch.ones(2, 5, dtype=torch.long)
        right[1, 3:] = 0
        with attend.hf.offload(model, self.client) as session:
            with self.assertRaisesRegex(ValueError, "left padding"):
                model.run(prompt, right, 1)
            session.reset()
            mask = causal_mask_4d(torch.ones(2, 5), 5, 0, "min")
            mask[:, :, 4, 0] = MIN  # a sliding window, say
            with self.assertRaisesRegex(ValueError, "not causal"):
                model(prompt, torch.arange(5)[None].expand(2, 5), mask, None)
            session.reset()
            mask = causal_mask_4d(torch.ones(2, 5), 5, 0, "min")
            mask[mask == 0] = 0.5
            with self.assertRaisesRegex(ValueError, "additive bias"):
                model(prompt, torch.arange(5)[None].expand(2, 5), mask, None)
            session.reset()
            mask = causal_mask_4d(torch.ones(2, 5), 5, 0, "min")
            mask[0, 0, 3, 1] = float("nan")
            with self.assertRaisesRegex(ValueError, "NaN"):
                model(prompt, torch.arange(5)[None].expand(2, 5), mask, None)
            session.reset()
            model(prompt, torch.arange(5)[None].expand(2, 5), None, None)
            with self.assertRaisesRegex(ValueError, "position_ids"):  # a skipped position
                model(prompt[:, :1], torch.full((2, 1), 6), None, None)
        self.assertAllReleased()
        with self.assertRaisesRegex(RuntimeError, "outside"):
            model(prompt, torch.arange(5)[None].expand(2, 5), None, None)

    def test_released_when_the_block_raises(self):
        model = StandInModel()
        model.use(attend.hf.attention_forward)
        with self.assertRaisesRegex(KeyError, "boom"):
            with attend.hf.offload(model, self.client):
                model.run(torch.randn(2, 4, 64), torch.ones(2, 4, dtype=torch.long), 2)
                self.assertEqual(self.client.stats().sequences, 2)
                raise KeyError("boom")
        self.assertAllReleased()

    def test_a_new_generation_in_the_same_session(self):
        model = StandInModel()
        model.use(attend.hf.attention_forward)
        with attend.hf.offload(model, self.client) as session:
            for cache in ("dynamic", "none", "dynamic"):
                model.run(torch.randn(2, 4, 64), torch.ones(2, 4, dtype=torch.long), 2,
                          cache=cache)
                self.assertEqual(self.client.stats().sequences, 2)
                self.assertEqual(session.tokens(1), [6, 6])
        self.assertAllReleased()

    # --- as transformers 5 calls it --------------------------------------------------------

    @contextlib.contextmanager
    def transformers5(self, masking=True):
        """transformers 5's registries and Cache in sys.modules for the block (the real
        transformers, if installed, is out of sight meanwhile)."""
        saved = attend.hf._CACHE_CLASS
        attend.hf._CACHE_CLASS = None
        try:
            with mock.patch.dict(sys.modules, transformers5_modules(masking)):
                yield sys.modules["transformers"]
        finally:
            attend.hf._CACHE_CLASS = saved

    def test_transformers5_left_padding(self):
        # transformers 5 builds a mask only for implementations in its mask registry: offload()
        # must register one, or padded rows attend to their padding.
        for cache in ("dynamic", "session"):
            with self.transformers5():
                self.compare(pads=[0, 3, 6], cache=cache, mask_kind="transformers5")
                self.compare(pads=[2, 0, 5], cache=cache, mask_kind="transformers5",
                             kv_dtype="bfloat16", rtol=2e-2)
                self.compare(cache=cache, mask_kind="transformers5")  # no padding: mask None

    def test_transformers5_registration(self):
        with self.transformers5() as transformers:
            from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
            self.assertEqual(attend.hf.register("attend-x"), "attend-x")
            self.assertIs(transformers.AttentionInterface._global_mapping["attend-x"],
                          attend.hf.attention_forward)
            self.assertIs(ALL_MASK_ATTENTION_FUNCTIONS["attend-x"], sdpa_mask)
            attend.hf.register("attend-x")  # again: no change, no error
            self.assertIs(ALL_MASK_ATTENTION_FUNCTIONS["attend-x"], sdpa_mask)
        with self.transformers5(masking=False) as transformers:  # 4.48-4.52: no mask registry
            self.assertEqual(attend.hf.register("attend-y"), "attend-y")
            self.assertIn("attend-y", transformers.AttentionInterface._global_mapping)

    def test_transformers5_session_cache(self):
        model = StandInModel()
        model.use(attend.hf.attention_forward)
        with self.transformers5(), \
                attend.hf.offload(model, self.client) as session:
            self.assertEqual(model.config._attn_implementation, "attend")
            cache = session.cache()
            self.assertIsInstance(cache, sys.modules["transformers.cache_utils"].Cache)
            self.assertFalse(cache.is_compileable)
            self.assertEqual(cache.get_max_cache_shape(), -1)
            self.assertEqual(cache.get_mask_sizes(5, 0), (5, 0))
            self.assertEqual(cache.get_mask_sizes(torch.arange(5), 0), (5, 0))  # 4.53-4.57
            mask_2d = torch.ones(2, 4, dtype=torch.long)
            model.run(torch.randn(2, 4, 64), mask_2d, 2, cache=cache, mask_kind="transformers5")
            self.assertEqual((cache.get_seq_length(0), cache.get_seq_length(1)), (6, 6))
            self.assertEqual(cache.get_mask_sizes(1, 1), (7, 0))
            self.assertEqual(session.tokens(1), [6, 6])
            # Beam search, assisted and contrastive decoding change rows or drop positions:
            # attend's sequences cannot follow, so the cache says so instead of ignoring it.
            for call in (lambda: cache.reorder_cache(torch.tensor([1, 0])),
                         lambda: cache.crop(3),
                         lambda: cache.batch_select_indices(torch.tensor([0])),
                         lambda: cache.batch_repeat_interleave(2)):
                with self.assertRaisesRegex(NotImplementedError, "num_beams=1"):
                    call()
            self.assertEqual(session.tokens(1), [6, 6])
        self.assertEqual(model.config._attn_implementation, "eager")
        self.assertAllReleased()

    def test_generation_config_compile_switched_off_meanwhile(self):
        model = StandInModel()
        model.use(attend.hf.attention_forward)
        model.generation_config = types.SimpleNamespace(disable_compile=False)
        with attend.hf.offload(model, self.client):
            self.assertTrue(model.generation_config.disable_compile)
        self.assertFalse(model.generation_config.disable_compile)

    # --- what an outside tester found: histories that differ, silently ------------------------

    def test_another_conversations_cache_is_refused(self):
        # Conversation A's prompt, then B's (a new generation: A's sequences are released), then
        # A's next step with A's DynamicCache: attend holds B's history, not A's.
        model = StandInModel()
        model.use(attend.hf.attention_forward)
        a, b = torch.randn(1, 5, 64), torch.randn(1, 5, 64)
        ones = torch.ones(1, 5, dtype=torch.long)
        with torch.no_grad(), self.transformers5(), \
                attend.hf.offload(model, self.client) as session:
            cache_a = DynamicCache()
            model(a, torch.arange(5)[None], causal_mask_4d(ones, 5, 0, "min"), cache_a)
            model(b, torch.arange(5)[None], causal_mask_4d(ones, 5, 0, "min"), DynamicCache())
            with self.assertRaisesRegex(ValueError, "different histories"):
                model(torch.randn(1, 1, 64), torch.tensor([[5]]), None, cache_a)
            # session.cache(): a second one ends the first one's generation.
            first = session.cache()
            model(a, torch.arange(5)[None], None, first)
            second = session.cache()
            model(b, torch.arange(5)[None], None, second)
            with self.assertRaisesRegex(RuntimeError, "generation the session has ended"):
                model(torch.randn(1, 1, 64), torch.tensor([[5]]), None, first)
            # The current one goes on, and its reset() starts it over.
            model(torch.randn(1, 1, 64), torch.tensor([[5]]), None, second)
            self.assertEqual(session.tokens(1), [6])
            second.reset()
            self.assertEqual((self.client.stats().sequences, second.get_seq_length()), (0, 0))
            model(a, torch.arange(5)[None], None, second)
            self.assertEqual(session.tokens(1), [5])
        self.assertAllReleased()

    def test_rows_reordered_in_the_models_cache_are_refused(self):
        # Beam search with transformers' own cache reorders its rows between steps; attend's
        # sequences cannot follow, and must not be read as if they had.
        model = StandInModel()
        model.use(attend.hf.attention_forward)
        mask = torch.ones(2, 4, dtype=torch.long)
        with torch.no_grad(), attend.hf.offload(model, self.client):
            cache = DynamicCache()
            model(torch.randn(2, 4, 64), torch.arange(4)[None].expand(2, 4),
                  causal_mask_4d(mask, 4, 0, "min"), cache)
            for layer in cache.k:  # beam_idx [1, 1]
                cache.k[layer] = cache.k[layer][[1, 1]]
                cache.v[layer] = cache.v[layer][[1, 1]]
            with self.assertRaisesRegex(ValueError, "row 0.*beam search"):
                model(torch.randn(2, 1, 64), torch.full((2, 1), 4), None, cache)
        self.assertAllReleased()

    def test_a_new_dynamic_cache_after_a_prompt_only_generation(self):
        # A generation of one prompt (no decode step: nothing says the model keeps its own
        # cache), then a new DynamicCache whose positions do not start at 0: its mask covers
        # no past, which says the model starts over.
        torch.manual_seed(3)
        model = StandInModel()
        x1, x2 = torch.randn(2, 6, 64), torch.randn(2, 4, 64)
        mask = torch.ones(2, 4, dtype=torch.long)
        mask[1, :1] = 0
        pos = torch.tensor([[6, 7, 8, 9], [1, 6, 7, 8]])
        model.use(eager_attention_forward)
        with torch.no_grad():
            want = model(x2, pos, causal_mask_4d(mask, 4, 0, "min"), DynamicCache())
        model.use(attend.hf.attention_forward)
        with torch.no_grad(), attend.hf.offload(model, self.client, kv_dtype="float32") as session:
            model(x1, torch.arange(6)[None].expand(2, 6), None, DynamicCache())
            got = model(x2, pos, causal_mask_4d(mask, 4, 0, "min"), DynamicCache())
            self.assertEqual(session.tokens(1), [4, 3])
        torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[1, 1:], want[1, 1:], rtol=1e-4, atol=1e-4)
        self.assertAllReleased()

    def test_chunked_prefill_with_padding_longer_than_a_chunk(self):
        # generate(prefill_chunk_size=...) sends a long prompt in chunks; a row padded past the
        # first chunk has nothing to send in it, and its prompt starts in a later one.
        for cache in ("dynamic", "none"):
            for chunk, pads in ((4, [0, 6]), (2, [3, 7]), (3, [0, 5]), (8, [0, 8]), (3, [8, 0])):
                torch.manual_seed(5)
                model = StandInModel()
                batch, length = 2, 8
                x = torch.randn(batch, length, 64)
                mask_2d = torch.ones(batch, length, dtype=torch.long)
                for b, p in enumerate(pads):
                    mask_2d[b, :p] = 0
                pos = (mask_2d.cumsum(-1) - 1).masked_fill(mask_2d == 0, 1)
                step = torch.randn(batch, 1, 64)
                full_2d = torch.cat([mask_2d, torch.ones(batch, 1, dtype=torch.long)], 1)
                model.use(eager_attention_forward)
                with torch.no_grad():
                    want_cache = DynamicCache()
                    want = model(x, pos, causal_mask_4d(mask_2d, length, 0, "min"), want_cache)
                    want_step = model(step, pos[:, -1:] + 1,
                                      causal_mask_4d(full_2d, 1, length, "min"), want_cache)
                model.use(attend.hf.attention_forward)
                with torch.no_grad(), attend.hf.offload(model, self.client,
                                                        kv_dtype="float32") as session:
                    kv = DynamicCache() if cache == "dynamic" else None
                    got = torch.cat([
                        model(x[:, c:c + chunk], pos[:, c:c + chunk],
                              causal_mask_4d(mask_2d[:, :c + chunk], min(chunk, length - c), c,
                                             "min"), kv)
                        for c in range(0, length, chunk)], 1)
                    got_step = model(step, pos[:, -1:] + 1,
                                     causal_mask_4d(full_2d, 1, length, "min"), kv)
                    self.assertEqual(session.tokens(1), [length + 1 - p for p in pads])
                what = "%s cache, chunks of %d, padding %s" % (cache, chunk, pads)
                for b, p in enumerate(pads):
                    torch.testing.assert_close(got[b, p:], want[b, p:], rtol=1e-4, atol=1e-4,
                                               msg=what)
                torch.testing.assert_close(got_step, want_step, rtol=1e-4, atol=1e-4, msg=what)
        self.assertAllReleased()

    def test_a_cache_holding_positions_attend_was_never_sent(self):
        # The model's cache was filled before this session (or before session.reset()): the
        # new position is its last, not its first, and attend holds none of the past.
        model = StandInModel()
        model.use(eager_attention_forward)
        cache = DynamicCache()
        with torch.no_grad():
            model(torch.randn(1, 5, 64), torch.arange(5)[None], None, cache)
        model.use(attend.hf.attention_forward)
        with torch.no_grad(), attend.hf.offload(model, self.client) as session:
            with self.assertRaisesRegex(ValueError, "never sent"):
                model(torch.randn(1, 1, 64), torch.tensor([[5]]), None, cache)
            # Held 3, the cache 3 + 1 + 2 more: also positions attend never had.
            session.reset()
            k = torch.randn(1, 2, 6, 16)
            q = torch.randn(1, 4, 1, 16)
            layer = model.layers[0]
            attend.hf.attention_forward(layer, torch.randn(1, 4, 3, 16), k[:, :, :3],
                                        k[:, :, :3], None, scaling=0.25)
            with self.assertRaisesRegex(ValueError, "never sent"):
                attend.hf.attention_forward(layer, q, k, k, None, scaling=0.25)
        self.assertAllReleased()

    def test_static_cache_over_two_generations(self):
        # A StaticCache returns its whole buffer, zeros past what is written; generate()
        # resets it between generations, and the second may start with a chunk of padding only
        # (padding="max_length"), where no position says "0".
        torch.manual_seed(6)
        model = StandInModel()
        x1, x2 = torch.randn(2, 5, 64), torch.randn(2, 6, 64)
        m1 = torch.ones(2, 5, dtype=torch.long)
        m2 = torch.ones(2, 6, dtype=torch.long)
        m2[:, :3] = 0
        m2[1, 3] = 0
        pos2 = (m2.cumsum(-1) - 1).masked_fill(m2 == 0, 1)
        model.use(eager_attention_forward)
        with torch.no_grad():
            want = model(x2, pos2, causal_mask_4d(m2, 6, 0, "min"), DynamicCache())
        model.use(attend.hf.attention_forward)
        with torch.no_grad(), attend.hf.offload(model, self.client, kv_dtype="float32") as session:
            cache = StaticCache(16)

            def static_mask(mask_2d, q_len, past):  # over all 16 positions, as transformers'
                mask = causal_mask_4d(mask_2d, q_len, past, "min")
                return torch.nn.functional.pad(mask, (0, 16 - mask.shape[-1]), value=MIN)

            model(x1, torch.arange(5)[None].expand(2, 5), static_mask(m1, 5, 0), cache)
            cache.reset()
            got = torch.cat([model(x2[:, c:c + 3], pos2[:, c:c + 3],
                                   static_mask(m2[:, :c + 3], 3, c), cache)
                             for c in (0, 3)], 1)
            self.assertEqual(session.tokens(1), [3, 2])
        torch.testing.assert_close(got[0, 3:], want[0, 3:], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[1, 4:], want[1, 4:], rtol=1e-4, atol=1e-4)
        self.assertAllReleased()

    def test_what_attend_does_not_compute_is_refused(self):
        model = StandInModel()
        model.use(attend.hf.attention_forward)
        layer = model.layers[0]
        q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16)
        with torch.no_grad(), attend.hf.offload(model, self.client) as session:
            for kwargs in ({"softcap": 5.0}, {"s_aux": torch.zeros(4)}, {"sinks": torch.zeros(4)},
                           {"is_causal": False}):
                with self.assertRaisesRegex(ValueError, "not supported"):
                    attend.hf.attention_forward(layer, q, k, k, None, **kwargs)
            layer.is_causal = False  # an encoder's attention
            with self.assertRaisesRegex(ValueError, "non-causal"):
                attend.hf.attention_forward(layer, q, k, k, None)
            del layer.is_causal
            # softcap None or 0, and a sliding window longer than the sequence: no change.
            attend.hf.attention_forward(layer, q, k, k, None, softcap=None, sliding_window=4,
                                        position_ids=torch.arange(3)[None])
            attend.hf.attention_forward(layer, q[:, :, :1], k[:, :, :1], k[:, :, :1], None,
                                        softcap=0, sliding_window=4,
                                        position_ids=torch.tensor([[3]]))
            with self.assertRaisesRegex(ValueError, "sliding-window"):
                attend.hf.attention_forward(layer, q[:, :, :1], k[:, :, :1], k[:, :, :1], None,
                                            sliding_window=4, position_ids=torch.tensor([[4]]))
            self.assertEqual(session.tokens(0), [4])
        self.assertAllReleased()

    def test_masks_that_differ_between_heads_are_refused(self):
        model = StandInModel()
        model.use(attend.hf.attention_forward)
        mask = causal_mask_4d(torch.ones(2, 5), 5, 0, "bool").expand(2, 4, 5, 5).clone()
        mask[:, 1, 4, 0] = False  # head 1 alone masks key 0 for query 4
        with torch.no_grad(), attend.hf.offload(model, self.client):
            with self.assertRaisesRegex(ValueError, "differs between heads"):
                model(torch.randn(2, 5, 64), torch.arange(5)[None].expand(2, 5), mask, None)
            same = causal_mask_4d(torch.ones(2, 5), 5, 0, "bool").expand(2, 4, 5, 5)
            model(torch.randn(2, 5, 64), torch.arange(5)[None].expand(2, 5), same, None)
            with self.assertRaisesRegex(ValueError, "dtype torch.int64"):
                model(torch.randn(2, 1, 64), torch.full((2, 1), 5),
                      torch.ones(2, 1, 1, 6, dtype=torch.long), None)
        self.assertAllReleased()

    def test_backward_is_refused(self):
        # The forward pass runs with gradients on (scoring without no_grad), but a backward
        # pass through attend's attention says it has none instead of leaving zeros.
        torch.manual_seed(4)
        model = StandInModel()
        x, pos = torch.randn(1, 3, 64), torch.arange(3)[None]
        mask = causal_mask_4d(torch.ones(1, 3), 3, 0, "min")
        model.use(eager_attention_forward)
        with torch.no_grad():
            want = model(x, pos, mask, None)
        model.use(attend.hf.attention_forward)
        with attend.hf.offload(model, self.client, kv_dtype="float32"):
            got = model(x, pos, mask, None)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            self.assertTrue(got.requires_grad)
            with self.assertRaisesRegex(RuntimeError, "no backward"):
                got.sum().backward()
        self.assertAllReleased()

    def test_layers_out_of_step_and_wrong_shapes(self):
        model = StandInModel()
        model.use(attend.hf.attention_forward)
        with torch.no_grad(), attend.hf.offload(model, self.client) as session:
            model(torch.randn(1, 3, 64), torch.arange(3)[None], None, None)
            model.layers[0](torch.randn(1, 1, 64), rotary_cos_sin(torch.tensor([[3]]), 16),
                            None, None, position_ids=torch.tensor([[3]]))  # layer 1 skipped
            with self.assertRaisesRegex(ValueError, "out of step"):
                model(torch.randn(1, 1, 64), torch.tensor([[4]]), None, None)
            # The step again, as a caller retrying it would: still out of step, and said so.
            with self.assertRaisesRegex(ValueError, "out of step"):
                model(torch.randn(1, 1, 64), torch.tensor([[4]]), None, None)
            session.reset()
            q = torch.randn(1, 4, 2, 16)
            with self.assertRaisesRegex(ValueError, "do not match query"):
                attend.hf.attention_forward(model.layers[0], q, torch.randn(1, 2, 2, 8),
                                            torch.randn(1, 2, 2, 8), None)
        with self.assertRaisesRegex(ValueError, "model is None"):
            with attend.hf.offload(None, self.client):
                pass
        self.assertAllReleased()

    def test_transformers_own_names_are_refused(self):
        model = StandInModel()
        with self.transformers5() as transformers:
            for name in ("sdpa", "eager", "flash_attention_2"):
                with self.assertRaisesRegex(ValueError, "transformers' own"):
                    with attend.hf.offload(model, self.client, name=name):
                        pass
            transformers.AttentionInterface.register("mine", eager_attention_forward)
            with self.assertRaisesRegex(ValueError, "already transformers' name"):
                attend.hf.register("mine")
            self.assertIs(transformers.AttentionInterface._global_mapping["mine"],
                          eager_attention_forward)
            self.assertNotIn("sdpa", transformers.AttentionInterface._global_mapping)
        self.assertEqual(model.config._attn_implementation, "eager")
        self.assertAllReleased()

    def test_session_cache_says_what_it_cannot_do(self):
        model = StandInModel()
        with self.transformers5(), attend.hf.offload(model, self.client) as session:
            cache = session.cache()
            self.assertFalse(cache.is_croppable)  # assisted decoding checks this first
            self.assertIsNone(cache.get_max_length(0))

    def test_real_transformers_llama(self):
        try:
            import transformers
        except ImportError:
            self.skipTest("transformers is not installed: the real LlamaForCausalLM part is "
                          "skipped (the stand-in above calls the function the same way)")
        config = transformers.LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
        model.config._attn_implementation = "eager"
        ids = torch.randint(0, 128, (2, 6))
        mask = torch.ones_like(ids)
        mask[1, :2] = 0
        kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                      output_scores=True, return_dict_in_generate=True, pad_token_id=0)
        want = model.generate(**kwargs)
        with attend.hf.offload(model, self.client, kv_dtype="float32") as session:
            got = model.generate(**kwargs)
            got_noop = model.generate(**kwargs, past_key_values=session.cache())
        self.assertAllReleased()
        for g in (got, got_noop):
            self.assertTrue(torch.equal(want.sequences, g.sequences))
            for a, b in zip(want.scores, g.scores):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
