#!/usr/bin/python3
"""bench/torch_peer.py's SDPA peer and compare_peers.py's table, with the torch at hand.

Debian's torch 1.13 has no scaled_dot_product_attention: the real torch must say "skipped
(torch 1.13 < 2.1)", and a reference SDPA (torch's documented semantics: top-left causal mask,
scale default d^-0.5, enable_gqa repeating K/V heads) with a fake version stands in for 2.11 and
2.1 (no enable_gqa) to run the SDPA code path: its peers must give the matmul peer's outputs on
small shapes (causal mask, GQA mapping, scale), its rows must appear with sane fields, and the
table must show them. Exit 77 (skipped) without torch.

    /usr/bin/python3 tests/bench/torch_peer_test.py [--repo .]
"""
import argparse
import io
import math
import os
import sys
import unittest
from unittest import mock

try:
    import torch
except ImportError:
    print("torch_peer_test: skipped (no torch; Debian's python3-torch provides it)")
    sys.exit(77)

parser = argparse.ArgumentParser()
parser.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), "..", ".."))
ARGS, rest = parser.parse_known_args()
sys.path.insert(0, os.path.join(os.path.abspath(ARGS.repo), "bench"))
import compare_peers  # noqa: E402
import torch_peer  # noqa: E402

SPEC = {"prefill": [[4, 2, 6, 8], [2, 2, 5, 16]], "decode": [[32, 8, 7, 2]]}  # decode: attend's heads


def reference_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                   scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention as torch 2.5+ documents it (no dropout,
    no attn_mask: the peers use neither), in f32."""
    assert attn_mask is None and dropout_p == 0.0
    n_q, n_kv = query.size(-2), key.size(-2)
    scale = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    bias = torch.zeros(n_q, n_kv)
    if is_causal:
        bias.masked_fill_(torch.ones(n_q, n_kv, dtype=torch.bool).tril(0).logical_not(),
                          float("-inf"))
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    elif query.size(-3) != key.size(-3):
        raise RuntimeError("query and key heads differ without enable_gqa")
    weights = torch.softmax(query.float() @ key.float().transpose(-2, -1) * scale + bias, -1)
    return (weights @ value.float()).to(query.dtype)


def reference_sdpa_2_1(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                       scale=None):
    """As torch 2.1-2.4: no enable_gqa (a call with it raises TypeError)."""
    return reference_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)


def wrong_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    """Forgets the causal mask: the check must catch it."""
    return reference_sdpa(query, key, value, attn_mask, dropout_p, False, scale, enable_gqa)


def fake_torch(version, sdpa):
    """Patches torch.__version__ and torch.nn.functional.scaled_dot_product_attention."""
    patches = [mock.patch.object(torch, "__version__", version),
               mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", sdpa,
                                 create=True)]

    class Both:
        def __enter__(self):
            for p in patches:
                p.start()

        def __exit__(self, *exc):
            for p in reversed(patches):
                p.stop()

    return Both()


def attend_rows():
    """attention_bench and decode_bench JSON rows for SPEC's shapes (f32 and bf16 prefill of the
    first shape, f32 decode), as compare_peers.py reads them."""
    prefill = [{"name": "BM_CausalPrefill/n:6/heads:4/kv_heads:2/d:8/bf16:%d/threads:0" % bf16,
                "useful_GFLOPs": 1.5, "ratio": 0.5, "matmul_GFLOPs": 3.0,
                "label": "onednn-flash/bf16-emulated" if bf16 else "onednn-flash/f32"}
               for bf16 in (0, 1)]
    decoded = [{"name": "BM_DecodeBatch/context:7/batch:2/storage:%d/threads:0/idle:0" % s,
                "KV_GBs": 2.0, "ratio": 0.4, "read_bw_GBs": 5.0} for s in (0, 2)]
    return prefill, decoded


class RealTorch(unittest.TestCase):
    def test_sdpa_support_follows_version(self):
        support = torch_peer.sdpa_support(torch)
        major, minor = torch_peer.version_tuple(torch.__version__)
        if (major, minor) < (2, 1):
            self.assertFalse(support["used"])
            self.assertEqual(support["reason"], "torch %d.%d < 2.1" % (major, minor))
            lines = compare_peers.describe_torch(
                {"version": torch.__version__, "sdpa": support, "results": []}, "py", 2)
            self.assertIn("PyTorch SDPA: skipped (torch %d.%d < 2.1)" % (major, minor), lines)
        else:
            self.assertTrue(support["used"])

    def test_version_tuple(self):
        self.assertEqual(torch_peer.version_tuple("2.11.0+cu130"), (2, 11))
        self.assertEqual(torch_peer.version_tuple("1.13.0a0"), (1, 13))
        self.assertLess(torch_peer.version_tuple("2.0.1"), torch_peer.SDPA_MIN)


class FakeSdpa(unittest.TestCase):
    def outputs_equal(self, a, b, dtype):
        tolerance = 1e-5 if dtype == torch.float32 else 3e-2
        self.assertEqual(tuple(a.shape), tuple(b.shape))
        diff = (a.float() - b.float()).abs().max().item()
        self.assertLessEqual(diff, tolerance)

    def test_support(self):
        with fake_torch("2.11.0", reference_sdpa):
            self.assertEqual(torch_peer.sdpa_support(torch),
                             {"used": True, "enable_gqa": True, "reason": ""})
        with fake_torch("2.1.2", reference_sdpa_2_1):
            self.assertEqual(torch_peer.sdpa_support(torch),
                             {"used": True, "enable_gqa": False, "reason": ""})
        with fake_torch("2.0.1", reference_sdpa_2_1):
            self.assertEqual(torch_peer.sdpa_support(torch)["reason"], "torch 2.0 < 2.1")

    def test_prefill_peers_compute_the_same_attention(self):
        torch.manual_seed(1)
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = torch_peer.prefill_inputs(torch, dtype, 6, 2, 9, 16)  # group of 3
            with fake_torch("2.11.0", reference_sdpa):
                peers = torch_peer.prefill_peers(torch, q, k, v, torch_peer.sdpa_support(torch))
                self.assertEqual(sorted(peers), ["matmul", "sdpa", "sdpa_gqa"])
                out = {name: fn() for name, fn in peers.items()}
            for name in ("sdpa", "sdpa_gqa"):
                self.outputs_equal(out[name], out["matmul"], dtype)
            # Causal: the first query sees only the first key, so its output is that value row;
            # query head h reads KV head h // 3 (repeat_interleave's mapping).
            for h in range(6):
                self.outputs_equal(out["sdpa_gqa"][h, 0], v[h // 3, 0], dtype)
            # Not a mask that hides everything but the diagonal: the last query mixes rows.
            self.assertGreater((out["matmul"][0, -1].float() - v[0, -1].float()).abs().max(), 0.01)

    def test_decode_peers_compute_the_same_attention(self):
        torch.manual_seed(2)
        for dtype in (torch.float32, torch.bfloat16):
            qs, ks, vs = torch_peer.decode_inputs(torch, dtype, 8, 2, 11, 3, d=16)
            with fake_torch("2.11.0", reference_sdpa):
                peers = torch_peer.decode_peers(torch, qs, ks, vs, torch_peer.sdpa_support(torch))
                self.assertEqual(sorted(peers), ["matmul", "sdpa", "sdpa_gqa"])
                out = {name: fn() for name, fn in peers.items()}
            # The matmul peer against a plain per-head loop: query head kv * 4 + g reads KV head kv.
            for b in range(3):
                for kv in range(2):
                    for g in range(4):
                        q = qs[b][kv, g].float()
                        p = torch.softmax(ks[b][kv].float() @ q * 16 ** -0.5, -1)
                        self.outputs_equal(out["matmul"][b][kv, g], p @ vs[b][kv].float(), dtype)
                for name in ("sdpa", "sdpa_gqa"):
                    self.outputs_equal(out[name][b], out["matmul"][b], dtype)

    def test_no_enable_gqa_measures_repeated_kv_only(self):
        q, k, v = torch_peer.prefill_inputs(torch, torch.float32, 4, 2, 5, 8)
        with fake_torch("2.3.0", reference_sdpa_2_1):
            peers = torch_peer.prefill_peers(torch, q, k, v, torch_peer.sdpa_support(torch))
            self.assertEqual(sorted(peers), ["matmul", "sdpa"])
            self.outputs_equal(peers["sdpa"](), peers["matmul"](), torch.float32)

    def test_measure_rows_and_table(self):
        with fake_torch("2.11.0", reference_sdpa):
            results = torch_peer.measure(torch, SPEC)
        self.assertEqual(results["version"], "2.11.0")
        self.assertTrue(results["sdpa"]["used"])
        for dtype in ("float32", "bfloat16"):
            for peer, diff in results["check"][dtype].items():
                self.assertLessEqual(diff, torch_peer.AGREE[dtype], (dtype, peer))
        rows = {(r["peer"], r["kind"], r["dtype"], tuple(r["shape"])): r
                for r in results["results"]}
        for dtype in ("float32", "bfloat16"):
            for shape in SPEC["prefill"]:
                peers = ["matmul", "sdpa"] + (["sdpa_gqa"] if shape[0] > shape[1] else [])
                for peer in peers:
                    r = rows.pop((peer, "prefill", dtype, tuple(shape)))
                    self.assertGreater(r["seconds"], 0)
                    heads, _, n, d = shape
                    flops = 4.0 * d * heads * n * (n + 1) / 2
                    self.assertAlmostEqual(r["useful_flops"] * r["seconds"], flops, delta=1e-3)
            for shape in SPEC["decode"]:
                for peer in ("matmul", "sdpa", "sdpa_gqa"):
                    r = rows.pop((peer, "decode", dtype, tuple(shape)))
                    self.assertGreater(r["seconds"], 0)
                    heads, kv, context, batch = shape
                    kv_bytes = 2.0 * batch * context * kv * 128 * (4 if dtype == "float32" else 2)
                    self.assertAlmostEqual(r["kv_bytes_per_second"] * r["seconds"], kv_bytes,
                                           delta=1e-3)
        self.assertEqual(rows, {})

        lines = compare_peers.describe_torch(results, "py", 2)
        # blas: the BLAS library this process has loaded (Debian's torch: BLAS_INFO "generic",
        # and the libblas.so.3 alternative's library), and the printed line says the same.
        if os.path.exists("/proc/self/maps"):
            with open("/proc/self/maps") as f:
                loaded = torch_peer.loaded_blas(f.read())
            self.assertEqual(results["blas"], loaded or results["blas_info"])
        self.assertIn("BLAS %s" % results["blas"], lines[0])
        self.assertTrue(any(line.startswith("PyTorch SDPA: torch.nn.functional") and
                            "enable_gqa=True" in line for line in lines), lines)
        self.assertFalse(any("DISAGREES" in line for line in lines), lines)

        prefill, decoded = attend_rows()
        out = io.StringIO()
        compare_peers.print_tables(prefill, decoded, results, {}, SPEC["prefill"],
                                   SPEC["decode"], out=out)
        table = out.getvalue().splitlines()
        headers = [line for line in table if line.startswith("shape")]
        self.assertEqual(len(headers), 2)
        for h in headers:
            self.assertEqual(h.split(")")[-1].split(),
                             ["attend", "ratio", "PyTorch", "ratio", "SDPA", "ratio", "SDPA", "gqa",
                              "ratio", "ggml", "ratio"])

        def cells(label):
            matches = [line for line in table if line.startswith(label + " ")]
            self.assertEqual(len(matches), 1, (label, table))
            return matches[0][compare_peers.LABEL_WIDTH:].split()

        # attend, ratio, PyTorch, ratio, SDPA, ratio, SDPA gqa, ratio, ggml, ratio.
        for label in ("4/2, 6, 8, float32", "4/2, 6, 8, bfloat16", "2/2, 5, 16, float32",
                      "2/2, 5, 16, bfloat16", "32/8, 7, 2, float32", "32/8, 7, 2, bfloat16"):
            c = cells(label)
            self.assertEqual(len(c), 10, c)
            gqa = not label.startswith("2/2")
            for i in (2, 3, 4, 5) + ((6, 7) if gqa else ()):  # the PyTorch peers, ratios
                self.assertGreaterEqual(float(c[i]), 0, (label, c))
            if not gqa:
                self.assertEqual(c[6:8], ["-", "-"], (label, c))
            self.assertEqual(c[8:], ["-", "-"])  # no ggml
        # A peers-only row (no attend case) has dashes for attend.
        self.assertEqual(cells("2/2, 5, 16, float32")[:2], ["-", "-"])
        # int8: attend only.
        self.assertEqual(cells("32/8, 7, 2, int8")[2:6], ["-", "-", "-", "-"])

    def test_check_catches_a_wrong_sdpa(self):
        with fake_torch("2.11.0", wrong_sdpa):
            diffs = torch_peer.check(torch, torch_peer.sdpa_support(torch))
            lines = compare_peers.describe_torch(
                {"version": "2.11.0", "sdpa": torch_peer.sdpa_support(torch), "check": diffs,
                 "results": []}, "py", 2)
        self.assertGreater(diffs["float32"]["sdpa"], 1e-2)
        self.assertTrue(any("DISAGREES" in line for line in lines), lines)


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main(argv=[sys.argv[0]] + rest)
