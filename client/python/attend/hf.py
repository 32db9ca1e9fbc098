"""attend as a transformers attention implementation (transformers >= 4.48, AttentionInterface).

    import attend, attend.hf
    with attend.Client(target) as client, attend.hf.offload(model, client) as session:
        out = model.generate(**inputs, past_key_values=session.cache(), max_new_tokens=32)

offload() registers attention_forward as the attention implementation "attend", points the
model's config at it, and keeps one attend sequence per batch row (created on the first call,
released when the `with` block ends, also when it raises). Each attention call is one
append_batch of the layer's new positions, packed; the output comes back as
[batch, q_len, n_head, head_dim], as transformers' attention functions return it.

Which positions are new: pass `past_key_values=session.cache()` (a transformers Cache that stores
nothing and reports the tokens attend holds; key/value then carry only the new positions), or
let transformers keep its own DynamicCache / StaticCache (key/value then carry the whole past, and
the columns attend already holds are sliced off: correct, but the model's device keeps a copy of
the cache). A new generation in the same session is recognized (position_ids restarting at 0, or
a full-cache call starting over) and the previous sequences are released first; session.reset()
does that explicitly.

Masks: None (causal, no padding), or [batch, 1 or heads (the same for each), q_len, kv_len] boolean
(True = attend) or additive (0 = attend; -inf, the dtype's minimum or -1e4 and below = masked).
register() gives the name the mask transformers builds for "sdpa": since 4.53 transformers builds
masks only for the implementations in its mask registry and passes None to the others. Left padding
(the prompt's first positions masked in a row) is handled: the padded positions are not sent and
their outputs are zeros, also where a chunked prefill (generate's prefill_chunk_size) sends a row's
padding over several calls, or a row's prompt is all padding (its first token is then the first one
generated). Anything else that is not causal (right padding, masked positions after the prompt,
sliding windows shorter than the sequence, additive biases, soft-capping, attention sinks,
is_causal=False) is refused with ValueError saying why, as are dropout > 0.

generate() with session.cache(): greedy or sampling. Beam search, assisted and contrastive decoding
reorder, repeat or crop the cache's rows, which attend's sequences cannot follow: the cache raises
NotImplementedError for those (is_croppable is False). With the model's own cache (DynamicCache,
StaticCache), the last key position attend holds is compared with the cache's at each call: a cache
from another conversation, or rows reordered by beam search, raise ValueError instead of being
answered from the wrong history. So does a cache holding positions attend was never sent (filled
before the session, or before session.reset()). That check looks at one position per layer: the
first attention layer's keys depend only on the token and its position, so with a single attention
layer two histories ending in the same token pass it. A session.cache() from an ended generation
raises RuntimeError. A new generation with the model's own cache must start its positions at 0 (as
generate() does) or come after session.reset(): its first call cannot always be told from the next
chunk of the last one otherwise. Gradients: attend computes none, and a backward pass through its
output raises RuntimeError rather than leave zeros. With torch < 2.5, transformers' sdpa mask turns
rows that mask everything into rows that mask nothing: a call in which a row has only padding is
then refused. Inside offload() the model's generation_config has disable_compile set (generate()
would compile the forward for a StaticCache on a GPU, and attend's calls cannot be traced).

This module imports without transformers; register() and cache() import it when called.
"""
import contextlib
import contextvars
import os
import time

from . import errors

__all__ = ["register", "attention_forward", "offload", "OffloadSession", "DEFAULT_NAME"]

DEFAULT_NAME = "attend"

# transformers' own implementations (besides what its registry holds): never replaced.
_BUILTIN_NAMES = frozenset({"eager", "sdpa", "flash_attention_2", "flash_attention_3",
                            "flex_attention", "paged_attention", "sdpa_paged", "eager_paged",
                            "flash_paged"})

_current = contextvars.ContextVar("attend_hf_session", default=None)


def register(name=DEFAULT_NAME):
    """Registers attention_forward as transformers' attention implementation `name`; returns
    the name. ImportError when transformers (>= 4.48, with AttentionInterface) is missing."""
    try:
        from transformers import AttentionInterface
    except ImportError as e:
        raise ImportError("attend.hf.register: needs transformers >= 4.48 (AttentionInterface): "
                          "%s" % e) from e
    # Registering over "sdpa" would send every model of the process that uses it to attend (and
    # fail outside offload()), also after the block; "eager" is never looked up.
    if name in _BUILTIN_NAMES:
        raise ValueError("attend.hf.register: '%s' is one of transformers' own attention "
                         "implementations; give attend another name" % name)
    taken = getattr(AttentionInterface, "_global_mapping", {}).get(name)
    if taken is not None and getattr(taken, "__module__", None) != __name__:
        raise ValueError("attend.hf.register: '%s' is already transformers' name for %s.%s; "
                         "give attend another name"
                         % (name, getattr(taken, "__module__", "?"),
                            getattr(taken, "__qualname__", taken)))
    AttentionInterface.register(name, attention_forward)
    _register_mask(name)
    return name


def _register_mask(name):
    """Gives `name` the mask that transformers builds for "sdpa" (boolean, True = attend; None
    where nothing is masked but the causal triangle). Since 4.53 (masking_utils) transformers
    builds a mask only for implementations in its mask registry and passes attention_mask=None
    to any other: left-padded batches would then attend to their padding without a word.
    Before 4.53 the model builds a 4-D mask for every implementation, and there is nothing to
    register."""
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    except ImportError:
        return
    mapping = getattr(ALL_MASK_ATTENTION_FUNCTIONS, "_global_mapping", {})
    if name in mapping:
        return
    sdpa = mapping.get("sdpa")
    if sdpa is None:
        raise ImportError("attend.hf.register: this transformers' mask registry has no 'sdpa' "
                          "mask to give '%s' (has: %s)" % (name, sorted(mapping)))
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa)


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      **kwargs):
    """transformers' attention-function signature: query [batch, n_head, q_len, head_dim],
    key/value [batch, n_head_kv, kv_len, head_dim]; returns (output [batch, q_len, n_head,
    head_dim_v], None). Runs through the session of the enclosing attend.hf.offload()."""
    session = getattr(module, "_attend_session", None) or _current.get()
    if session is None:
        raise RuntimeError("attend.hf: the 'attend' attention ran outside "
                           "`with attend.hf.offload(model, client)` (no session to send it to)")
    return session.attention(module, query, key, value, attention_mask, scaling=scaling,
                             dropout=dropout, **kwargs)


@contextlib.contextmanager
def offload(model, client, *, kv_dtype="bfloat16", layers=None, name=DEFAULT_NAME,
            prefix=None, precision=None):
    """A `with` block in which `model` computes attention through attend (see the module's
    text). Yields the OffloadSession; its sequences are released when the block ends. The
    model's attention implementation is restored afterwards. Without transformers (a model
    written against the same calling convention) nothing is registered: the model's modules
    get the session and call attention_forward themselves."""
    if model is None:
        raise ValueError("attend.hf.offload: model is None")
    try:
        import transformers
    except ImportError:
        transformers = None
    registered = False
    if transformers is not None:
        register(name)  # first: a name it refuses leaves nothing to undo
        registered = True
    session = OffloadSession(client, model, kv_dtype=kv_dtype, layers=layers, prefix=prefix,
                             precision=precision)
    config = getattr(model, "config", None)
    old_impl = getattr(config, "_attn_implementation", None) if config is not None else None
    # generate() compiles the forward pass on its own for a compileable cache (StaticCache) on
    # a GPU; attend's calls (gRPC, host copies) cannot be traced, so that stays off meanwhile.
    generation_config = getattr(model, "generation_config", None)
    old_compile = getattr(generation_config, "disable_compile", None)
    tagged = []
    token = _current.set(session)
    try:
        if registered and config is not None:
            config._attn_implementation = name
        if old_compile is not None:
            generation_config.disable_compile = True
        for m in (model.modules() if hasattr(model, "modules") else ()):
            if hasattr(m, "layer_idx"):
                m._attend_session = session
                tagged.append(m)
        yield session
    finally:
        _current.reset(token)
        for m in tagged:
            try:
                del m._attend_session
            except AttributeError:
                pass
        if registered and config is not None:
            config._attn_implementation = old_impl
        if old_compile is not None:
            generation_config.disable_compile = old_compile
        session.close()


class OffloadSession:
    """One generation's sequences in attend (one per batch row) and what the calls cost:
    calls, seconds (client wall time inside append_batch) and server_seconds (the responses'
    ComputeStats.compute_seconds)."""

    def __init__(self, client, model=None, *, kv_dtype="bfloat16", layers=None, prefix=None,
                 precision=None):
        self.client = client
        self.kv_dtype = kv_dtype
        self.precision = precision
        self.prefix = prefix or "hf-" + os.urandom(4).hex()
        if layers is None and model is not None:
            config = getattr(model, "config", None)
            config = getattr(config, "get_text_config", lambda: config)() if config else None
            layers = getattr(config, "num_hidden_layers", None)
        self.layers = layers
        self.calls = 0
        self.seconds = 0.0
        self.server_seconds = 0.0
        self._generation = 0
        self._closed = False
        self._clear()

    # --- state ------------------------------------------------------------------------------

    def _clear(self):
        self.sequence_ids = []
        self._shape = None       # (batch, n_head, n_head_kv, head_dim, head_dim_v, scale)
        self._pad = None         # per row: leading padded columns of the prompt
        self._columns = {}       # layer -> mask/key columns consumed (padding included)
        self._tokens = {}        # layer -> per row: tokens attend holds
        self._full_cache = False  # key/value seen carrying the past (DynamicCache, StaticCache)
        self._mask_memo = None
        self._last_position = None  # per row: the last position_ids value sent (layer 0)
        self._last_key = {}  # layer -> the last key position sent, [batch, n_head_kv, d]
        self._lead = None  # the generation's first attention layer (0 unless layer 0 is not)

    def tokens(self, layer=0):
        """Tokens attend holds for each row in `layer` (padding excluded)."""
        return list(self._tokens.get(layer, [0] * len(self.sequence_ids)))

    def seq_length(self, layer=0):
        """Columns (positions, left padding included) the layer has consumed: what a
        transformers cache reports as its sequence length. A layer attend has not seen (a
        hybrid model's layer that is not attention) answers as the first attention layer."""
        if layer not in self._columns and self._lead is not None:
            layer = self._lead
        return self._columns.get(layer, 0)

    def reset(self):
        """Releases this generation's sequences; the next call starts a new one."""
        ids = self.sequence_ids
        self._clear()
        self._generation += 1
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

    def close(self):
        """Releases the sequences (the end of offload())."""
        self._closed = True
        self.reset()

    def cache(self):
        """A transformers Cache that stores nothing and reports this session's lengths: pass it
        as past_key_values so that key/value carry only the new positions. Starts a new
        generation (releases the previous sequences)."""
        self.reset()
        return _cache_class()(self)

    # --- the attention call -----------------------------------------------------------------

    def attention(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  **kwargs):
        import torch
        if self._closed:
            raise RuntimeError("attend.hf: the offload session has ended")
        layer = getattr(module, "layer_idx", None)
        if not isinstance(layer, int) or layer < 0:
            raise ValueError("attend.hf: the attention module has no layer_idx (got %r); "
                             "attend needs the layer's index" % (layer,))
        if self.layers is None:
            raise ValueError("attend.hf: the number of layers is unknown: the model has no "
                             "config.num_hidden_layers; pass offload(..., layers=N)")
        if layer >= self.layers:
            raise ValueError("attend.hf: layer_idx %d, but the session has %d layers"
                             % (layer, self.layers))
        if dropout:
            raise ValueError("attend.hf: attention dropout (%r) is not supported; use "
                             "model.eval()" % dropout)
        # What would change the attention's arithmetic, and that attend does not do.
        if getattr(module, "is_causal", True) is False or kwargs.get("is_causal") is False:
            raise ValueError("attend.hf: non-causal attention (an encoder's, or cross-attention: "
                             "is_causal=False) is not supported; attend computes causal "
                             "self-attention")
        refused = [name for name in ("s_aux", "sinks") if kwargs.get(name) is not None]
        if kwargs.get("softcap"):  # None or 0: no soft-capping
            refused.append("softcap")
        if refused:
            raise ValueError("attend.hf: %s (logit soft-capping or attention sinks) is not "
                             "supported: attend computes plain softmax attention" % refused[0])
        if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
            raise ValueError("attend.hf: query/key/value must be [batch, heads, len, head_dim]; "
                             "got %s, %s, %s" % (list(query.shape), list(key.shape),
                                                 list(value.shape)))
        batch, n_head, q_len, head_dim = query.shape
        n_head_kv, kv_len, head_dim_v = key.shape[1], key.shape[2], value.shape[3]
        if key.shape[0] != batch or value.shape[:3] != key.shape[:3] or \
                key.shape[3] != head_dim:
            raise ValueError("attend.hf: key %s / value %s do not match query %s"
                             % (list(key.shape), list(value.shape), list(query.shape)))

        # A new generation in the same session, seen at the first attention layer: a full cache
        # starting over; position 0 again in a row that has started (anywhere in the call: a
        # prompt padded beyond its longest row has padding, position 0 or 1, in every row's
        # first column); a mask over no more keys than queries; a StaticCache emptied.
        positions = kwargs.get("position_ids")
        lead = self._lead if self._lead is not None else layer
        if layer == lead and self._columns.get(lead, 0) > 0:
            restart = self._full_cache and kv_len == q_len
            if positions is not None and not restart:
                # Only in a row that has started: a row whose prompt starts in a later chunk of
                # a chunked prefill has its position 0 there.
                pos = positions.detach()
                pos = (pos[None, :] if pos.dim() == 1 else pos).expand(batch, q_len)
                started = self._last_position
                if started is None or len(started) != batch:
                    started = [0] * batch  # no rows to go by: any position 0
                restart = any(started[b] is not None and int(pos[b].min()) == 0
                              for b in range(batch))
            if attention_mask is not None and attention_mask.dim() == 4 and not restart:
                restart = attention_mask.shape[-1] == q_len
            # A StaticCache reset between generations: the last position attend holds is zeros.
            if not restart and self._full_cache and kv_len > self._columns[lead] and \
                    not bool(key[:, :, self._columns[lead] - 1].any()):
                restart = True
            if restart:
                self.reset()
        if self._lead is None:
            self._lead = layer
        lead = self._lead
        if layer == lead and any(c != self._columns.get(lead, 0) for c in self._columns.values()):
            raise ValueError(
                "attend.hf: the layers hold %s positions: out of step (a step failed part way, "
                "or layers were skipped); start again with session.reset() or session.cache()"
                % dict(sorted(self._columns.items())))
        if layer != lead and self._columns.get(layer, 0) + q_len != self._columns.get(lead, 0):
            raise ValueError(
                "attend.hf: layer %d holds %d positions and layer %d %d, with %d new: the layers "
                "are out of step (a step failed part way, or layers were skipped); start again "
                "with session.reset() or session.cache()"
                % (layer, self._columns.get(layer, 0), lead, self._columns.get(lead, 0), q_len))

        columns = self._columns.get(layer, 0)
        # A sliding window matters only once the sequence is longer than it.
        window = kwargs.get("sliding_window")
        if window and columns + q_len > window:
            raise ValueError("attend.hf: sliding-window attention (sliding_window=%r) over %d "
                             "positions is not supported: attend attends to every position it "
                             "holds" % (window, columns + q_len))
        if kv_len == q_len:
            new_k, new_v = key, value
        elif kv_len >= columns + q_len:
            # The whole past, as a transformers cache returns it: exactly the held positions
            # and the new ones (DynamicCache), or those then unwritten zeros (StaticCache).
            # Anything else holds positions attend was never sent.
            if kv_len > columns + q_len and bool(key[:, :, columns + q_len].any()):
                raise ValueError(
                    "attend.hf: layer %d got %d key positions for %d queries, with %d positions "
                    "sent to attend: the model's cache holds positions attend was never sent "
                    "(a cache filled outside this session, or before session.reset()); start "
                    "the generation from an empty cache" % (layer, kv_len, q_len, columns))
            self._full_cache = True
            self._check_past(layer, key, columns)
            new_k, new_v = key[:, :, columns:columns + q_len], value[:, :, columns:columns + q_len]
        else:
            raise ValueError(
                "attend.hf: layer %d got %d key positions for %d queries, with %d positions "
                "already sent: neither only the new ones nor the whole past (start a new "
                "generation with session.reset() or session.cache())"
                % (layer, kv_len, q_len, columns))

        shape = (batch, n_head, n_head_kv, head_dim, head_dim_v, scaling)
        if not self.sequence_ids:
            self._create(shape)
        elif shape != self._shape:
            raise ValueError("attend.hf: this call's shape (batch, n_head, n_head_kv, head_dim, "
                             "head_dim_v, scaling) %s differs from the session's %s; call "
                             "session.reset() between generations" % (shape, self._shape))

        pad = self._padding(attention_mask, layer, columns, q_len)
        counts = [q_len - p for p in pad]
        if positions is not None and layer == lead:
            self._check_positions(positions, pad, q_len)

        q_t = query.transpose(1, 2)   # [batch, q_len, n_head, head_dim]
        k_t = new_k.transpose(1, 2)
        v_t = new_v.transpose(1, 2)
        if any(pad):
            q_p = torch.cat([q_t[b, pad[b]:] for b in range(batch)])
            k_p = torch.cat([k_t[b, pad[b]:] for b in range(batch)])
            v_p = torch.cat([v_t[b, pad[b]:] for b in range(batch)])
        else:
            q_p = q_t.reshape(batch * q_len, n_head, head_dim)
            k_p = k_t.reshape(batch * q_len, n_head_kv, head_dim)
            v_p = v_t.reshape(batch * q_len, n_head_kv, head_dim_v)
        # Rows whose positions in this call are all padding (a chunked prefill's first chunks,
        # shorter than the row's padding) have nothing to send: attend takes 1 or more tokens.
        active = [b for b in range(batch) if counts[b] > 0]
        tokens = list(self._tokens.get(layer, [0] * batch))
        if active:
            start = time.perf_counter()
            r = self.client.append_batch(
                layer, [self.sequence_ids[b] for b in active], q_p.contiguous(),
                k_p.contiguous(), v_p.contiguous(), counts=[counts[b] for b in active],
                precision=self.precision)
            self.seconds += time.perf_counter() - start
            self.server_seconds += r.stats.compute_seconds
            self.calls += r.calls
            for b, n in zip(active, r.layer_tokens):
                tokens[b] = n
            out = r.output.to(query.device, query.dtype)
        else:
            out = query.new_zeros((0, n_head, head_dim_v))
        self._columns[layer] = columns + q_len
        self._tokens[layer] = tokens
        self._last_key[layer] = new_k[:, :, -1].detach().clone()

        if any(pad):
            full = out.new_zeros((batch, q_len, n_head, head_dim_v))
            row = 0
            for b in range(batch):
                full[b, pad[b]:] = out[row:row + counts[b]]
                row += counts[b]
            out = full
        else:
            out = out.view(batch, q_len, n_head, head_dim_v)
        if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or
                                        value.requires_grad):
            # Detached, the output would give the model zero gradients without a word.
            out = _no_backward().apply(out, query, key, value)
        return out, None

    def _check_past(self, layer, key, columns):
        """key carries the past (a transformers cache): its last column attend holds must be
        the one sent, row by row, or attend's sequences and the model's cache are two different
        histories (another conversation's cache, rows reordered by beam search)."""
        import torch
        sent = self._last_key.get(layer)
        if sent is None or columns == 0:
            return
        held = key[:, :, columns - 1]
        sent = sent.to(held.device, held.dtype)
        if torch.equal(held, sent):
            return
        for b in range(key.shape[0]):
            if not torch.equal(held[b], sent[b]):
                raise ValueError(
                    "attend.hf: layer %d, row %d: the cache's key at position %d is not the one "
                    "attend was sent: the model's cache and attend's sequences hold different "
                    "histories (another conversation's cache; rows reordered or selected, as "
                    "beam search does; a cache that changes the keys it holds, as "
                    "QuantizedCache does; or a new generation that did not start at position "
                    "0), which attend cannot follow; start again with session.reset() or "
                    "session.cache()" % (layer, b, columns - 1))

    def _create(self, shape):
        batch, n_head, n_head_kv, head_dim, head_dim_v, scaling = shape
        self._shape = shape
        ids = ["%s-%d-%d" % (self.prefix, self._generation, b) for b in range(batch)]
        try:
            for sid in ids:
                self.client.create_sequence(
                    sid, layers=self.layers, n_head=n_head, n_head_kv=n_head_kv,
                    head_dim=head_dim, head_dim_v=head_dim_v, kv_dtype=self.kv_dtype,
                    scale=scaling)
                self.sequence_ids.append(sid)
        except BaseException:
            self.reset()
            raise

    def _padding(self, mask, layer, columns, q_len):
        """Per row, the leading masked positions of this call (left padding, only in the
        first call of a layer); ValueError for a mask that is not causal over the rest."""
        batch = len(self.sequence_ids)
        if mask is None:
            if self._pad is not None and columns and any(self._pad):
                raise ValueError("attend.hf: attention_mask is None in a padded batch")
            return [0] * batch
        memo = (mask.data_ptr(), tuple(mask.shape), columns, q_len)
        if self._mask_memo is not None and self._mask_memo[0] == memo:
            return self._mask_memo[1]
        import torch
        if mask.dim() != 4 or mask.shape[0] not in (1, batch) or mask.shape[2] != q_len or \
                mask.shape[3] < columns + q_len:
            raise ValueError("attend.hf: attention_mask %s: expected [batch, 1, %d, >= %d]"
                             % (list(mask.shape), q_len, columns + q_len))
        if not (mask.dtype == torch.bool or mask.dtype.is_floating_point):
            raise ValueError("attend.hf: attention_mask of dtype %s: expected bool (True = "
                             "attend) or floating point (0 = attend, -inf or the minimum = "
                             "masked)" % mask.dtype)
        if mask.shape[1] > 1 and not bool((mask == mask[:, :1]).all()):
            raise ValueError("attend.hf: attention_mask %s differs between heads: attend applies "
                             "one mask to every head" % list(mask.shape))
        m = mask[:, 0].cpu()
        if m.dtype == torch.bool:
            allowed = m
        else:
            if bool(torch.isnan(m).any()):
                raise ValueError("attend.hf: attention_mask holds NaN")
            # Masked: -inf, the dtype's minimum, or -1e4 and below as older models write it
            # (a weight of e^-10000 or less: zero in any float type).
            allowed = m > -1e4
            if bool((m[allowed] != 0).any()):
                raise ValueError("attend.hf: attention_mask carries an additive bias (values "
                                 "other than 0 and -1e4 or below); attend computes plain "
                                 "attention")
        allowed = allowed.expand(batch, q_len, allowed.shape[-1])
        end = columns + q_len
        causal = torch.ones(q_len, q_len, dtype=torch.bool).tril()
        leading = self._pad if self._pad is not None else [0] * batch
        pad = []
        for b in range(batch):
            new = allowed[b, q_len - 1, columns:end]
            p = int(q_len - new.sum())
            if not bool(new[p:].all()) or (p and bool(new[:p].any())):
                raise ValueError("attend.hf: row %d masks positions after its first real token "
                                 "(right padding?); only left padding is supported "
                                 "(tokenizer.padding_side = 'left')" % b)
            # Padding may go on in this call only while the row has had nothing but padding
            # (its prompt's start, in one call or over a chunked prefill's calls).
            if p and leading[b] < columns:
                raise ValueError("attend.hf: row %d masks %d new positions after the prompt; "
                                 "attend holds every position it was sent" % (b, p))
            want = causal[p:, :].clone()
            want[:, :p] = False
            if not torch.equal(allowed[b, p:, columns:end], want) or \
                    bool(allowed[b, p:, end:].any()):
                raise ValueError("attend.hf: row %d's mask is not causal over its new positions "
                                 "(sliding window or custom mask?): not supported" % b)
            if columns:
                past = self._past_allowed(b, columns)
                if not torch.equal(allowed[b, p:, :columns],
                                   past[None, :].expand(q_len - p, columns)):
                    raise ValueError("attend.hf: row %d's mask over its past differs from what "
                                     "attend holds (only leading padding may be masked)" % b)
            pad.append(p)
        if self._pad is None and columns:
            self._pad = [0] * batch  # the session's first mask comes after unpadded calls
        if self._pad is None or any(pad):
            self._pad = [leading[b] + pad[b] if leading[b] == columns else leading[b]
                         for b in range(batch)]
        self._mask_memo = (memo, pad)
        return pad

    def _past_allowed(self, b, columns):
        import torch
        past = torch.ones(columns, dtype=torch.bool)
        past[:(self._pad[b] if self._pad else 0)] = False
        return past

    def _check_positions(self, positions, pad, q_len):
        """position_ids of the sent tokens: consecutive in each row, continuing the row's
        previous call (any offset: rotary embeddings are relative, so positions counting the
        padding work as well as positions counting only real tokens)."""
        import torch
        pos = positions.detach().cpu().to(torch.long)
        if pos.dim() == 1:
            pos = pos[None, :]
        pos = pos.expand(len(pad), q_len)
        last = self._last_position or [None] * len(pad)
        for b, p in enumerate(pad):
            got = pos[b, p:]
            if got.numel() == 0:
                continue  # only padding so far
            start = int(got[0]) if last[b] is None else last[b] + 1
            want = torch.arange(start, start + q_len - p)
            if not torch.equal(got, want):
                raise ValueError(
                    "attend.hf: row %d's position_ids %s, expected %s (consecutive, after the "
                    "row's previous position): the model skipped or repeated positions, which "
                    "attend cannot since it holds every position it was sent"
                    % (b, got.tolist()[:8], want.tolist()[:8]))
            last[b] = int(want[-1])
        self._last_position = last


_NO_BACKWARD = None


def _no_backward():
    """An autograd function that passes attend's output on and refuses a backward pass: attend
    computes no gradients, and a detached output would leave the model's at zero silently."""
    global _NO_BACKWARD
    if _NO_BACKWARD is None:
        import torch

        class NoBackward(torch.autograd.Function):
            @staticmethod
            def forward(ctx, out, *inputs):
                return out.clone()

            @staticmethod
            def backward(ctx, *grads):
                raise RuntimeError("attend.hf: attention through attend has no backward pass "
                                   "(it computes no gradients); train with an in-process "
                                   "attention implementation")

        _NO_BACKWARD = NoBackward
    return _NO_BACKWARD


_CACHE_CLASS = None


def _cache_class():
    """A transformers Cache subclass that stores nothing (the KV cache lives in attend) and
    reports the session's sequence length; built on first use (imports transformers)."""
    global _CACHE_CLASS
    if _CACHE_CLASS is not None:
        return _CACHE_CLASS
    try:
        from transformers.cache_utils import Cache
    except ImportError as e:
        raise ImportError("attend.hf: session.cache() needs transformers: %s" % e) from e

    class AttendCache(Cache):
        is_compileable = False

        is_croppable = False

        def __init__(self, session):
            try:
                super().__init__(layers=[])  # transformers >= 5: the layers, none kept here
            except TypeError:
                super().__init__()  # 4.x: Cache() takes no layers
            self.session = session
            self.layers = []
            self.generation = session._generation

        def _check(self):
            if self.generation != self.session._generation:
                raise RuntimeError(
                    "attend.hf: this cache belongs to a generation the session has ended "
                    "(session.cache() or session.reset() was called since): its sequences are "
                    "released; use the cache of the current generation")

        def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
            self._check()
            return key_states, value_states  # only the new positions reach the attention

        def reset(self):
            """transformers' Cache.reset(): empty. Releases the session's sequences; this cache
            then belongs to the session's new generation."""
            self.session.reset()
            self.generation = self.session._generation

        def get_seq_length(self, layer_idx=0):
            self._check()
            return self.session.seq_length(layer_idx or 0)

        def get_max_cache_shape(self, layer_idx=0):
            return -1  # no maximum, as transformers' DynamicCache says it

        def get_max_length(self, layer_idx=None):
            return None  # transformers < 4.45 asks this instead: None, no maximum

        def get_mask_sizes(self, query, layer_idx=0):
            # transformers >= 5 passes the query length; 4.53-4.57 the cache_position tensor.
            q_len = query if isinstance(query, int) else int(query.shape[0])
            return self.get_seq_length(layer_idx) + q_len, 0

        # What generate() would do to the positions attend holds: attend keeps every position
        # it was sent and one sequence per row, so dropping positions, reordering or repeating
        # rows (beam search, contrastive search, assisted decoding) would leave attend's
        # sequences out of step with the model. transformers' base class does these on its
        # (empty) layers and returns, which would be wrong without a word: refuse instead.
        def _refuse(self, what):
            raise NotImplementedError(
                "attend.hf: %s is not supported with session.cache() (attend holds one "
                "sequence per row, every position it was sent): use greedy or sampling "
                "generation (num_beams=1, no assistant model)" % what)

        def reorder_cache(self, beam_idx):
            self._refuse("reordering the cache's rows (beam search)")

        def crop(self, max_length):
            self._refuse("cropping the cache (assisted or contrastive decoding)")

        def batch_select_indices(self, indices):
            self._refuse("selecting the cache's rows")

        def batch_repeat_interleave(self, repeats):
            self._refuse("repeating the cache's rows (beam search, num_return_sequences)")

        @property
        def is_sliding(self):
            return [False] * (self.session.layers or 0)

        def __len__(self):
            return self.session.layers or 0

    _CACHE_CLASS = AttendCache
    return AttendCache
