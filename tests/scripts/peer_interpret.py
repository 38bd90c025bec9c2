#!/usr/bin/env python3
"""CPU check of bench/peer_triton.py (the benchmark's peer) under the Triton interpreter, no GPU.

What runs here is the peer's own code path end to end except the MXFP4 inner loop: quantize
(triton_kernels' downcast_to_mxfp), every routing path (triton_kernels.routing, torch top-6 padded
with -1 slots, torch grouped top-k + bitmatrix + routing_from_bitmatrix), matmul_ogs's gather,
fused SwiGLU, biases, routing weights, scatter and k-way reduction -- against peer_triton's float64
reference. The interpreter runs neither tl.dot_scaled nor the Hopper path's inline PTX, and gets
bf16 tl.dot wrong, so matmul_ogs gets the MXFP4 values decoded to float32 (layout "dense"); the
Hopper layouts are checked by their own inverse, the decoding against triton_kernels' upcast.

Needs torch, triton 3.6 and scripts/fetch_peer.sh's .peer/ on PYTHONPATH; exits 77 (ctest:
skipped) when one is missing:
    PYTHONPATH=.peer python3 tests/scripts/peer_interpret.py
"""
import os
import sys
import unittest

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))

try:
    import torch
    import triton  # noqa: F401
    import triton_kernels  # noqa: F401
except ImportError as e:
    print(f"SKIPPED: {e} (needs torch, triton and .peer/ from scripts/fetch_peer.sh on PYTHONPATH)")
    sys.exit(77)


def install_interpreter_shims():
    """What triton 3.6's interpreter lacks to run triton_kernels on the CPU; test-only."""
    import functools
    import inspect
    import types

    import triton.language as tl
    import triton.runtime.interpreter as interp
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    # A CUDA target without Hopper features (cuda_capability_geq(9) is false: no Hopper paths).
    class FakeCudaDriver:
        def get_current_target(self):
            return GPUTarget("cuda", 80, 32)

        def get_active_torch_device(self):
            return torch.device("cpu")

    driver.set_active(FakeCudaDriver())
    torch.cuda.get_device_capability = lambda *a: (8, 0)
    torch.cuda.get_device_properties = lambda *a: types.SimpleNamespace(multi_processor_count=4,
                                                                        shared_memory_per_block_optin=232448)
    # `int % constexpr` (compiled Triton folds it).
    tl.core.constexpr.__rmod__ = lambda self, other: tl.core.constexpr(other % self.value)

    # triton_kernels hands its own Tensor (torch tensor in .storage.data) straight to kernels.
    def is_tk_tensor(t):
        return hasattr(t, "storage") and hasattr(t.storage, "layout")

    unwrap, rewrap = interp._unwrap_tensor, interp._rewrap_tensor
    interp._unwrap_tensor = lambda t: t.storage.data if is_tk_tensor(t) else unwrap(t)
    interp._rewrap_tensor = lambda t, original_tensor: t if is_tk_tensor(original_tensor) else rewrap(t, original_tensor)

    # Scalars passed into nested jit functions arrive as 1-element arrays.
    patch = interp._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patch_lang_tensor

    # matmul_ogs specializes its kernels by rewriting their source (JITFunction only); here the
    # same specialization is a call with the constants bound and the tuple arguments regrouped.
    def specialize(fn, module, constants, tuples, name=None, do_not_specialize=()):
        params = list(inspect.signature(fn.fn).parameters)

        class Specialized:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    full, rest = {}, list(args)
                    for p in params:
                        if p in constants:
                            full[p] = constants[p]
                        elif not rest:
                            break
                        elif p in tuples:
                            full[p], rest = tuple(rest[:len(tuples[p])]), rest[len(tuples[p]):]
                        else:
                            full[p] = rest.pop(0)
                    assert not rest, "more positional arguments than the kernel takes"
                    full.update(kwargs)
                    full.update({p: constants[p] for p in params if p in constants})
                    full.update({p: tuple() for p in params if p in tuples and p not in full})
                    return fn[grid](**full)
                return launch

        return Specialized()

    import triton_kernels.matmul_ogs as matmul_ogs_module
    matmul_ogs_module.specialize = specialize

    # get_scaled_dot_format_string returns a str where compiled Triton has a constexpr.
    dot_scaled = tl.core.dot_scaled

    @functools.wraps(dot_scaled)
    def dot_scaled_constexpr(lhs, lhs_scale, lhs_format, rhs, rhs_scale, rhs_format, *a, **k):
        c = lambda f: tl.core.constexpr(f) if isinstance(f, str) else f
        return dot_scaled(lhs, lhs_scale, c(lhs_format), rhs, rhs_scale, c(rhs_format), *a, **k)

    dot_scaled_constexpr.__triton_builtin__ = True
    tl.core.dot_scaled = tl.dot_scaled = dot_scaled_constexpr


install_interpreter_shims()
import peer_triton as pt  # noqa: E402

TK = pt.import_peer()


def tiny(routing, experts, top_k, n_group=1, topk_group=1, scaling=1.0, biases=False, hidden=64, inter=96):
    return pt.Shape(f"tiny-{routing}-k{top_k}", experts, hidden, inter, top_k, routing, n_group, topk_group, scaling,
                    biases)


class Decoding(unittest.TestCase):
    def test_decode_matches_triton_kernels_upcast(self):
        w = (torch.randn(3, 64, 96) * torch.logspace(-3, 3, 96)).to(torch.bfloat16)
        w[0, 0, :32] = 0.0  # an all-zero block
        q, s = TK.downcast_to_mxfp(w, torch.uint8, axis=-1)
        ours = pt.decode_mxfp4(q, s)
        theirs = TK.upcast_from_mxfp(q, s, torch.float32, axis=-1).double()
        self.assertTrue(torch.equal(ours, theirs))
        self.assertLess(float((ours - w.double()).norm() / w.double().norm()), 0.2)  # it is a 4-bit quantization

    def test_decode_known_values(self):
        q = torch.tensor([[0x21, 0xF7] + [0] * 14], dtype=torch.uint8)  # elements 1, 2, 6, -6, then zeros
        s = torch.tensor([[128]], dtype=torch.uint8)  # 2^1
        self.assertEqual(pt.decode_mxfp4(q, s)[0, :4].tolist(), [1.0, 2.0, 12.0, -12.0])
        self.assertTrue(torch.isnan(pt.decode_mxfp4(q, torch.tensor([[255]], dtype=torch.uint8))).all())


class HopperLayouts(unittest.TestCase):
    def test_chunked_conversion_equals_one_call_and_inverts(self):
        sh = tiny("topk_softmax", 6, 2, hidden=96, inter=64)
        q, s = pt.quantize_experts(TK, sh.experts, 2 * sh.intermediate, sh.hidden, 7, "cpu")
        saved = pt.CHUNK_ELEMENTS
        try:
            pt.CHUNK_ELEMENTS = 2 * q[0].numel()  # several chunks of 2 experts
            w, ws = pt.to_kernel_layout(TK, q, s, "hopper")
            pt.CHUNK_ELEMENTS = 1 << 40  # one call
            w1, ws1 = pt.to_kernel_layout(TK, q, s, "hopper")
        finally:
            pt.CHUNK_ELEMENTS = saved
        for a, b in ((w, w1), (ws, ws1)):
            self.assertEqual(a.storage.data.stride(), b.storage.data.stride())
            self.assertTrue(torch.equal(a.storage.data, b.storage.data))
            self.assertEqual(a.shape, b.shape)
            self.assertEqual(type(a.storage.layout), type(b.storage.layout))
        self.assertEqual(w.shape, [sh.experts, sh.hidden, 2 * sh.intermediate])  # logical [E, K, N]
        back = w.storage.layout.unswizzle_data(w.storage.data)
        self.assertTrue(torch.equal(back, q.transpose(-2, -1)))
        padded = torch.nn.functional.pad(s, (0, -s.shape[-1] % 4))  # vLLM's scale padding on sm90
        back = ws.storage.layout.unswizzle_data(ws.storage.data)
        self.assertTrue(torch.equal(back[..., :padded.shape[-1], :padded.shape[-2]], padded.transpose(-2, -1)))


class Routing(unittest.TestCase):
    def test_ties_go_to_the_lower_expert(self):
        sh = tiny("softmax_topk", 6, 2)
        logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 2.0, 0.0], [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
        ids, w, decisive = pt.route_reference(logits, sh, None)
        self.assertEqual(ids.tolist(), [[1, 3], [1, 2]])
        self.assertTrue(torch.allclose(w, torch.full_like(w, 0.5)))
        self.assertEqual(decisive.tolist(), [True, True])  # exact ties are decided by the rule
        tids, tw = pt.torch_routing({"shape": sh, "correction": None}, logits.float())
        self.assertEqual(tids.tolist(), ids.tolist())

    def test_near_ties_are_flagged(self):
        sh = tiny("topk_softmax", 4, 1)
        ids, _, decisive = pt.route_reference(torch.tensor([[0.0, 1.0, 1.0 + 1e-7, -1.0]], dtype=torch.float64), sh, None)
        self.assertEqual(ids.tolist(), [[2]])
        self.assertEqual(decisive.tolist(), [False])

    def test_grouped_known_answer(self):
        # 8 experts in 4 groups of 2, best 2 groups, top 2, renormalized, scaled by 2.5. Choice =
        # sigmoid + bias; group 1 (experts 2, 3) and group 3 (6, 7) win on the bias although
        # expert 0 has the largest logit.
        sh = tiny("sigmoid_grouped_topk", 8, 2, n_group=4, topk_group=2, scaling=2.5)
        logits = torch.tensor([[3.0, -3.0, 0.0, 0.5, -3.0, -3.0, 1.0, -1.0]], dtype=torch.float64)
        bias = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0])
        ids, w, _ = pt.route_reference(logits, sh, bias)
        self.assertEqual(sorted(ids[0].tolist()), [3, 6])
        sig = torch.sigmoid(logits[0, [3, 6]])
        self.assertTrue(torch.allclose(w[0].sort().values, (sig / sig.sum() * 2.5).sort().values))
        tids, tw = pt.torch_routing({"shape": sh, "correction": bias}, logits.float())
        self.assertEqual(sorted(tids[0].tolist()), [3, 6])
        self.assertTrue(torch.allclose(tw[0].double().sort().values, w[0].sort().values, rtol=1e-6))

    def test_bitmatrix_known_answer(self):
        ids = torch.tensor([[31, 0, -1, -1], [63, 32, 33, -1]])
        bm = pt.pack_bitmatrix(TK, ids, 64).storage.data.view(torch.int32)
        expected = [[(1 << 31) | 1, 0], [0, (1 << 31) | 3]]
        self.assertEqual([[v & 0xFFFFFFFF for v in r] for r in bm.tolist()], expected)


class CheckRows(unittest.TestCase):
    def test_subset(self):
        self.assertEqual(pt.check_rows(1), [0])
        self.assertEqual(pt.check_rows(8), list(range(8)))
        rows = pt.check_rows(16384)
        self.assertEqual(len(rows), 48)
        self.assertEqual(rows[:8], list(range(8)))
        self.assertEqual(rows[-1], 16383)
        self.assertEqual(rows, sorted(set(rows)))


class Compare(unittest.TestCase):
    def test_rows_are_matched_by_token_and_near_ties_left_out(self):
        checked = [0, 1, 5, 9]
        ref = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 4.0]], dtype=torch.float64)
        decisive = torch.tensor([True, True, False, True])
        position = {r: i for i, r in enumerate(checked)}
        sel = torch.tensor([0, 1, 5])  # T = 6: token 9 is not there
        got = torch.tensor([[1.0, 0.0], [0.0, 2.2], [99.0, 0.0]], dtype=torch.float64)  # token 5 is a near tie
        c = pt.compare(ref, decisive, position, sel, got)
        self.assertEqual((c["checked_tokens"], c["near_ties"]), (2, 1))
        self.assertAlmostEqual(c["rel_l2"], 0.2 / 5 ** 0.5)
        self.assertAlmostEqual(c["max_err_rel"], 0.1)


class EndToEnd(unittest.TestCase):
    """peer_forward (layout "dense") against reference_rows, for every routing path."""

    CASES = [
        tiny("topk_softmax", 8, 2, biases=True),                       # triton_kernels.routing, biases (gpt-oss)
        tiny("softmax_topk", 16, 4),                                   # triton_kernels.routing (Qwen3)
        tiny("softmax_topk", 16, 3),                                   # torch top-3 padded to 4 (k = 6 path)
        tiny("sigmoid_grouped_topk", 16, 4, n_group=4, topk_group=2, scaling=2.5),  # DeepSeek-V3
        tiny("sigmoid_grouped_topk", 12, 4, scaling=2.827),            # Kimi-K2
    ]

    def run_case(self, sh, T, logits_dtype):
        layer = pt.make_layer(TK, sh, "cpu", layout="dense", seed=sh.experts + sh.top_k)
        gen = torch.Generator().manual_seed(T)
        x = torch.randn(T, sh.hidden, generator=gen).to(torch.bfloat16)
        logits = torch.randn(T, sh.experts, generator=gen).to(logits_dtype)
        got = pt.peer_forward(TK, layer, x.float(), logits).double()
        ref, decisive = pt.reference_rows(x, logits, layer)
        got, ref = got[decisive], ref[decisive]
        self.assertGreater(len(ref), 0)
        return float((got - ref).norm() / ref.norm())

    def test_float32_logits_exact_semantics(self):
        for sh in self.CASES:
            for T in (1, 7):
                with self.subTest(shape=sh.name, T=T):
                    self.assertLess(self.run_case(sh, T, torch.float32), 1e-6)

    def test_bf16_logits_as_vllm(self):
        # bf16 logits (ties at the top-k boundary are frequent) give bf16 routing weights: ~1e-3.
        for sh in self.CASES:
            with self.subTest(shape=sh.name):
                self.assertLess(self.run_case(sh, 9, torch.bfloat16), 4e-3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
