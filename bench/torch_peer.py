"""The PyTorch peers of bench/compare_peers.py, measured in a child process of it:

  matmul    matmul + masked softmax + matmul, as a straightforward implementation does (any torch)
  sdpa      torch.nn.functional.scaled_dot_product_attention (torch >= 2.1), K/V repeated to the
            query heads for prefill as the matmul peer's, and for decode each KV head's group of
            query heads taken as its query rows (as the matmul peer does)
  sdpa_gqa  the same function with enable_gqa=True (torch >= 2.5): K/V as they are, only where
            the query heads outnumber the KV heads

    python3 bench/torch_peer.py THREADS SPEC_JSON    # prints one JSON object

SPEC_JSON: {"prefill": [[heads, kv_heads, n, d], ...], "decode": [[heads, kv_heads, context,
batch], ...]} (decode at head_dim 128). Before measuring, every peer is run on a small shape
(causal prefill with GQA, and decode) and compared with the matmul peer: "check" in the JSON.
Where `import torch` fails with an ImportError (ModuleNotFoundError included), it exits NO_TORCH
(3) with one line on stderr that starts "torch_peer.py: import torch failed: ", which
compare_peers.py tells from any other failure.

The functions take the torch module as an argument and look the SDPA function up when called,
so that tests/bench/torch_peer_test.py can stand a reference SDPA and a version in for a torch
that has none.
"""
import json
import os
import re
import sys
import time

SDPA_MIN = (2, 1)  # scale= came in 2.1
DECODE_DIM = 128
DTYPES = ("float32", "bfloat16")
# Largest |SDPA - matmul peer| on the check's shape (values of order 1) that still counts as
# the same attention. bf16: the matmul peer rounds q.k and the weights to bf16, a fused kernel
# need not (a reference SDPA in f32 differs by 0.02); a wrong mask or scale differs by 0.3 and up.
AGREE = {"float32": 1e-4, "bfloat16": 1e-1}
# Exit status and stderr line when `import torch` raises ImportError.
NO_TORCH = 3
NO_TORCH_PREFIX = "torch_peer.py: import torch failed: "
# BLAS libraries by their file names, implementations before the libblas.so shims (Debian's
# libblas.so.3 alternative is one, and loads the implementation it belongs to).
BLAS_NAMES = [("openblas", re.compile(r"libopenblas")), ("mkl", re.compile(r"libmkl_")),
              ("blis", re.compile(r"libblis")), ("flexiblas", re.compile(r"libflexiblas")),
              ("blas", re.compile(r"libblas\.so"))]


def version_tuple(version):
    m = re.match(r"(\d+)\.(\d+)", str(version))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def sdpa_support(torch):
    """{"used": bool, "reason": why not, "enable_gqa": bool} for this torch."""
    version = version_tuple(torch.__version__)
    if version < SDPA_MIN:
        return {"used": False, "enable_gqa": False,
                "reason": "torch %d.%d < %d.%d" % (version + SDPA_MIN)}
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return {"used": False, "enable_gqa": False,
                "reason": "torch %s has no scaled_dot_product_attention" % torch.__version__}
    # enable_gqa came in 2.5; a builtin has no signature to inspect, so a tiny call tells.
    try:
        q, k = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 1, 8)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, k, enable_gqa=True)
        gqa = tuple(out.shape) == (1, 2, 1, 8)
    except (TypeError, RuntimeError):
        gqa = False
    return {"used": True, "enable_gqa": gqa, "reason": ""}


def sdpa(torch, *args, **kwargs):
    return torch.nn.functional.scaled_dot_product_attention(*args, **kwargs)


def prefill_peers(torch, q, k, v, support):
    """Causal prefill: peer name -> fn() giving the output, [heads, n, d]. q: [heads, n, d];
    k, v: [kv_heads, n, d]."""
    heads, n, d = q.shape
    group = heads // k.shape[0]
    dtype = q.dtype
    kr, vr = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)

    def matmul():
        s = (q @ kr.transpose(1, 2)) * (d ** -0.5)
        s = s.masked_fill(mask, float("-inf"))
        return torch.softmax(s.float(), -1).to(dtype) @ vr

    peers = {"matmul": matmul}
    if support["used"]:
        q4, kr4, vr4, k4, v4 = (x.unsqueeze(0) for x in (q, kr, vr, k, v))
        peers["sdpa"] = lambda: sdpa(torch, q4, kr4, vr4, is_causal=True, scale=d ** -0.5)[0]
        if support["enable_gqa"] and group > 1:
            peers["sdpa_gqa"] = lambda: sdpa(torch, q4, k4, v4, is_causal=True, scale=d ** -0.5,
                                             enable_gqa=True)[0]
    return peers


def decode_peers(torch, qs, ks, vs, support):
    """One decode step of a batch: peer name -> fn() giving the list of outputs, each
    [kv_heads, group, d] (query head h = kv_head * group + g). qs: [kv_heads, group, d] per
    sequence; ks, vs: [kv_heads, context, d]."""
    kv, group, d = qs[0].shape
    dtype = qs[0].dtype

    def matmul():
        return [torch.softmax(((q @ k.transpose(1, 2)) * d ** -0.5).float(), -1).to(dtype) @ v
                for q, k, v in zip(qs, ks, vs)]

    peers = {"matmul": matmul}
    if support["used"]:
        q4s = [q.unsqueeze(0) for q in qs]
        k4s = [k.unsqueeze(0) for k in ks]
        v4s = [v.unsqueeze(0) for v in vs]
        peers["sdpa"] = lambda: [sdpa(torch, q, k, v, scale=d ** -0.5)[0]
                                 for q, k, v in zip(q4s, k4s, v4s)]
        if support["enable_gqa"] and group > 1:
            # One query token of kv * group heads.
            qh = [q.reshape(1, kv * group, 1, d) for q in qs]
            peers["sdpa_gqa"] = lambda: [
                sdpa(torch, q, k, v, scale=d ** -0.5, enable_gqa=True)[0].reshape(kv, group, d)
                for q, k, v in zip(qh, k4s, v4s)]
    return peers


def best(fn, reps=3):
    fn()
    t = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - start)
    return t


def prefill_inputs(torch, dtype, heads, kv, n, d):
    return (torch.randn(heads, n, d, dtype=dtype), torch.randn(kv, n, d, dtype=dtype),
            torch.randn(kv, n, d, dtype=dtype))


def decode_inputs(torch, dtype, heads, kv, context, batch, d=DECODE_DIM):
    group = heads // kv
    return ([torch.randn(kv, group, d, dtype=dtype) for _ in range(batch)],
            [torch.randn(kv, context, d, dtype=dtype) for _ in range(batch)],
            [torch.randn(kv, context, d, dtype=dtype) for _ in range(batch)])


def check(torch, support):
    """Every peer against the matmul peer on small shapes (causal prefill 4/2 heads, n 7, d 16;
    decode 4/2 heads, context 9, d 16, batch 2): {dtype: {peer: max |difference|}}."""
    torch.manual_seed(0)
    diffs = {}
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        inputs = prefill_inputs(torch, dtype, 4, 2, 7, 16)
        prefill = {name: fn() for name, fn in prefill_peers(torch, *inputs, support).items()}
        inputs = decode_inputs(torch, dtype, 4, 2, 9, 2, d=16)
        decode = {name: fn() for name, fn in decode_peers(torch, *inputs, support).items()}
        diffs[dtype_name] = {}
        for name in prefill:
            if name == "matmul":
                continue
            d = (prefill[name].float() - prefill["matmul"].float()).abs().max().item()
            if name in decode:
                for a, b in zip(decode[name], decode["matmul"]):
                    d = max(d, (a.float() - b.float()).abs().max().item())
            diffs[dtype_name][name] = d
    return diffs


def loaded_blas(maps):
    """The BLAS library mapped into a process, from its /proc/PID/maps text: OpenBLAS, MKL, BLIS
    or FlexiBLAS before a plain libblas.so (the reference BLAS, or a shim that loaded one of
    those); "" when none is (a BLAS linked into libtorch, as pip's MKL is)."""
    found = {}
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = fields[5].strip()
        name = os.path.basename(path)
        for kind, pattern in BLAS_NAMES:
            if pattern.match(name):
                found.setdefault(kind, path)
                break
    for kind, _ in BLAS_NAMES:
        if kind in found:
            return found[kind]
    return ""


def measure(torch, spec):
    """The JSON compare_peers.py reads: version, threads, blas, blas_info, sdpa (sdpa_support's),
    check, results (one per peer, dtype and shape). blas: the BLAS library this process has
    mapped (what torch's matmuls call), else blas_info; blas_info: torch's build-time BLAS_INFO
    ("generic" for Debian's torch, which calls whatever libblas.so.3 the alternative names)."""
    support = sdpa_support(torch)
    results = []
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        for heads, kv, n, d in spec["prefill"]:
            inputs = prefill_inputs(torch, dtype, heads, kv, n, d)
            pairs = heads * n * (n + 1) // 2
            for peer, fn in prefill_peers(torch, *inputs, support).items():
                seconds = best(fn)
                results.append({"kind": "prefill", "peer": peer, "dtype": dtype_name,
                                "shape": [heads, kv, n, d], "seconds": seconds,
                                "useful_flops": 4.0 * d * pairs / seconds})
            del inputs
        for heads, kv, context, batch in spec["decode"]:
            inputs = decode_inputs(torch, dtype, heads, kv, context, batch)
            kv_bytes = 2.0 * batch * context * kv * DECODE_DIM * (4 if dtype_name == "float32"
                                                                  else 2)
            for peer, fn in decode_peers(torch, *inputs, support).items():
                seconds = best(fn)
                results.append({"kind": "decode", "peer": peer, "dtype": dtype_name,
                                "shape": [heads, kv, context, batch], "seconds": seconds,
                                "kv_bytes_per_second": kv_bytes / seconds})
            del inputs
    config = torch.__config__.show() if hasattr(torch, "__config__") else ""
    blas_info = re.search(r"BLAS_INFO=([^,\s]+)", config)
    blas_info = blas_info.group(1) if blas_info else ""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        maps = ""
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return {"version": str(torch.__version__), "threads": torch.get_num_threads(),
            "blas": loaded_blas(maps) or blas_info, "blas_info": blas_info,
            "cpu_capability": capability() if capability else "", "sdpa": support,
            "check": check(torch, support) if support["used"] else {}, "results": results}


def main():
    try:
        import torch
    except ImportError as e:
        sys.stderr.write("%s%s: %s\n" % (NO_TORCH_PREFIX, type(e).__name__, e))
        sys.exit(NO_TORCH)
    torch.set_num_threads(int(sys.argv[1]))
    print(json.dumps(measure(torch, json.loads(sys.argv[2]))))


if __name__ == "__main__":
    main()
