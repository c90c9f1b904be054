"""Self-tests of the PyTorch reference (torch_reference.py), independent of the C++ trainer.

They check properties the contract implies rather than particular numbers:
  - RoPE: the score q.k of rotated vectors depends only on the difference of the two positions;
  - the fused QKV split follows the per-KV-group row layout;
  - the hand-written softmax attention equals a plain loop over queries and keys;
  - document masking: changing the first of two packed documents leaves every output of the
    second unchanged, and the second document packed after the first gives the same outputs as
    the same document alone at the start of a window (position ids restart at 0);
  - the LR schedule, the per-micro-batch objective and the hand-written AdamW (against
    torch.optim.AdamW, which implements the same PyTorch form);
  - the dropout masks (dropout_masks.py): Philox4x32-10 against Random123's known answers, the
    documented coordinate mapping against the known answers the C++ test (test_dropout.cpp) uses,
    the keep fraction, and a mask of ones as the identity.

Run with /usr/bin/python3 (Debian's python3-torch); takes about a second.
"""

import math
import sys
import unittest

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

import numpy as np  # noqa: E402
import torch  # noqa: E402

import dropout_masks  # noqa: E402
import torch_reference as ref  # noqa: E402

torch.set_num_threads(1)


def small_shape(num_heads=4, num_kv_heads=2, tie_embeddings=False):
    return ref.ModelShape(vocab_size=32, hidden_size=16, num_layers=2, num_heads=num_heads,
                          num_kv_heads=num_kv_heads, ffn_hidden_size=24, seq_length=12,
                          norm_eps=1e-5, rope_theta=10000.0, tie_embeddings=tie_embeddings)


def random_params(shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    params = {}
    for name, dims in ref.parameter_shapes(shape).items():
        if len(dims) == 1:  # norm weights: around 1
            params[name] = 1.0 + 0.1 * torch.randn(dims, generator=generator, dtype=ref.DTYPE)
        else:
            params[name] = 0.3 * torch.randn(dims, generator=generator, dtype=ref.DTYPE)
    return params


class RopeTest(unittest.TestCase):
    def test_score_depends_only_on_position_difference(self):
        D, theta = 16, 10000.0
        generator = torch.Generator().manual_seed(1)
        q = torch.randn(1, 1, 1, D, generator=generator, dtype=ref.DTYPE)   # [B, heads, T, D]
        k = torch.randn(1, 1, 1, D, generator=generator, dtype=ref.DTYPE)

        def score(q_pos, k_pos):
            cos_q, sin_q = ref.rope_cos_sin(torch.tensor([[q_pos]]), D, theta)   # [1, 1, D]
            cos_k, sin_k = ref.rope_cos_sin(torch.tensor([[k_pos]]), D, theta)
            return float((ref.apply_rope(q, cos_q, sin_q) * ref.apply_rope(k, cos_k, sin_k)).sum())

        for q_pos, k_pos in [(0, 0), (5, 2), (17, 3), (40, 39)]:
            base = score(q_pos, k_pos)
            for shift in (1, 7, 100, 1000):
                self.assertAlmostEqual(score(q_pos + shift, k_pos + shift), base, delta=1e-12)
        # ... and it does depend on the difference (the rotation is not the identity).
        self.assertGreater(abs(score(5, 2) - score(5, 3)), 1e-3)

    def test_position_zero_is_identity_and_norm_is_kept(self):
        D = 8
        generator = torch.Generator().manual_seed(5)
        x = torch.randn(2, 3, 4, D, generator=generator, dtype=ref.DTYPE)        # [B, heads, T, D]
        positions = torch.tensor([[0, 1, 2, 3], [9, 0, 30, 4]])                  # [B, T]
        cos, sin = ref.rope_cos_sin(positions, D, 10000.0)
        rotated = ref.apply_rope(x, cos, sin)
        self.assertTrue(torch.equal(rotated[0, :, 0], x[0, :, 0]))
        torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1), rtol=1e-14, atol=0)


class QkvLayoutTest(unittest.TestCase):
    def test_grouped_rows(self):
        NH, NKV, D = 4, 2, 2
        rows = (NH + 2 * NKV) * D
        qkv = torch.arange(rows, dtype=ref.DTYPE).view(1, 1, rows)               # feature f = f
        q, k, v = ref.split_qkv(qkv, NH, NKV, D)
        # Group 0: q0 (0,1) q1 (2,3) k0 (4,5) v0 (6,7); group 1: q2 (8,9) q3 (10,11) k1 v1.
        self.assertEqual(q[0, :, 0].tolist(), [[0, 1], [2, 3], [8, 9], [10, 11]])
        self.assertEqual(k[0, :, 0].tolist(), [[4, 5], [12, 13]])
        self.assertEqual(v[0, :, 0].tolist(), [[6, 7], [14, 15]])


class AttentionTest(unittest.TestCase):
    def test_matches_a_plain_loop(self):
        B, NH, NKV, T, D = 2, 4, 2, 6, 4
        generator = torch.Generator().manual_seed(2)
        q = torch.randn(B, NH, T, D, generator=generator, dtype=ref.DTYPE)
        k = torch.randn(B, NKV, T, D, generator=generator, dtype=ref.DTYPE)
        v = torch.randn(B, NKV, T, D, generator=generator, dtype=ref.DTYPE)
        document_ids = torch.tensor([[0, 0, 1, 1, 1, -1], [0, 0, 0, 0, 0, 0]])
        allowed = ref.attention_allowed(document_ids, document_masking=True)
        out = ref.masked_softmax_attention(q, k, v, allowed)
        for b in range(B):
            for h in range(NH):
                kv = h // (NH // NKV)
                for i in range(T):
                    keys = [j for j in range(i + 1) if document_ids[b, i] == document_ids[b, j]]
                    scores = [float(q[b, h, i] @ k[b, kv, j]) / math.sqrt(D) for j in keys]
                    top = max(scores)
                    weights = [math.exp(s - top) for s in scores]
                    expected = sum(w * v[b, kv, j] for w, j in zip(weights, keys)) / sum(weights)
                    torch.testing.assert_close(out[b, h, i], expected, rtol=1e-13, atol=1e-15)


class DocumentMaskingTest(unittest.TestCase):
    # One window of T = 12: document A at positions 0..4 (its last token is EOS = 1), document B
    # at positions 5..11 (continuing past the window), position ids restarting for B.
    doc_a = [7, 3, 9, 4, 1]
    doc_b = [5, 8, 2, 6, 11, 13, 4]
    positions = [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]
    document_ids = [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]

    def logits(self, params, shape, tokens, positions, document_ids, masking=True):
        return ref.forward(params, torch.tensor([tokens]), torch.tensor([positions]),
                           torch.tensor([document_ids]), shape, masking)[0]    # [T, V]

    def test_second_document_is_independent_of_the_first(self):
        for num_kv_heads, tied in [(2, False), (4, True), (1, False)]:
            shape = small_shape(num_kv_heads=num_kv_heads, tie_embeddings=tied)
            params = random_params(shape)
            changed_a = [12, 30, 17, 21, 1]
            base = self.logits(params, shape, self.doc_a + self.doc_b, self.positions,
                               self.document_ids)
            other = self.logits(params, shape, changed_a + self.doc_b, self.positions,
                                self.document_ids)
            # Masked keys get weight exactly 0, so document B's outputs are bit-identical.
            self.assertTrue(torch.equal(base[5:], other[5:]))
            self.assertGreater(float((base[:5] - other[:5]).abs().max()), 1e-3)

            # Without the mask the change leaks into document B (the test can fail).
            base_causal = self.logits(params, shape, self.doc_a + self.doc_b, self.positions,
                                      self.document_ids, masking=False)
            other_causal = self.logits(params, shape, changed_a + self.doc_b, self.positions,
                                       self.document_ids, masking=False)
            self.assertGreater(float((base_causal[5:] - other_causal[5:]).abs().max()), 1e-3)

    def test_packed_document_equals_document_alone(self):
        shape = small_shape()
        params = random_params(shape, seed=3)
        packed = self.logits(params, shape, self.doc_a + self.doc_b, self.positions,
                             self.document_ids)
        # Document B alone at the start of a window, followed by padding (token 0, document -1).
        alone = self.logits(params, shape, self.doc_b + [0] * 5, list(range(7)) + [0] * 5,
                            [0] * 7 + [-1] * 5)
        torch.testing.assert_close(packed[5:], alone[:7], rtol=1e-12, atol=1e-13)


class ObjectiveAndOptimizerTest(unittest.TestCase):
    def test_learning_rate_schedule(self):
        optim = {"lr": 1.0, "min_lr": 0.1, "warmup_steps": 2, "decay_steps": 6}
        expected = {1: 0.5, 2: 1.0, 4: 0.1 + 0.45 * (1 + math.cos(math.pi * 2 / 4)), 6: 0.1, 7: 0.1}
        for step, lr in expected.items():
            self.assertAlmostEqual(ref.learning_rate(step, optim), lr, delta=1e-15)
        no_warmup = dict(optim, warmup_steps=0)
        self.assertAlmostEqual(ref.learning_rate(1, no_warmup),
                               0.1 + 0.45 * (1 + math.cos(math.pi / 6)), delta=1e-15)
        # Megatron-LM's scheduler: update s at n = s - 1 scheduler steps (warm-up from warmup_init).
        megatron = dict(optim, schedule_convention="megatron", warmup_init=0.2)
        expected = {1: 0.2, 2: 0.6, 3: 1.0, 5: 0.1 + 0.45 * (1 + math.cos(math.pi * 2 / 4)), 7: 0.1, 8: 0.1}
        for step, lr in expected.items():
            self.assertAlmostEqual(ref.learning_rate(step, megatron), lr, delta=1e-15)
        for global_batch in (1, 3, 8):  # samples or iterations: the same ratios
            self.assertAlmostEqual(ref.megatron_scheduler.rate(5, megatron, global_batch), expected[5], delta=1e-15)

    def test_per_microbatch_mean(self):
        token_losses = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, 0.0], [0.0, 0.0]],
                                    dtype=ref.DTYPE)
        targets = torch.tensor([[5, 5], [5, -100], [-100, -100], [-100, -100]])
        # Micro-batch 0 (windows 0,1): 6/3; micro-batch 1 (no loss tokens): 0/1.
        self.assertEqual(float(ref.objective(token_losses, targets, "per_microbatch_mean", 2)), 1.0)
        self.assertEqual(float(ref.objective(token_losses, targets, "global_token_mean", 2)), 2.0)

    def test_adamw_matches_torch_optim(self):
        optim = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
        generator = torch.Generator().manual_seed(4)
        params = {"matrix": torch.randn(3, 4, generator=generator, dtype=ref.DTYPE),
                  "vector": torch.randn(4, generator=generator, dtype=ref.DTYPE)}
        torch_params = [params["matrix"].clone().requires_grad_(True),
                        params["vector"].clone().requires_grad_(True)]
        torch_optimizer = torch.optim.AdamW(
            [{"params": [torch_params[0]], "weight_decay": 0.1},
             {"params": [torch_params[1]], "weight_decay": 0.0}],
            lr=0.01, betas=(0.9, 0.95), eps=1e-8)
        state = {}
        for step, lr in enumerate([0.01, 0.01, 0.01], start=1):
            grads = {name: torch.randn(p.shape, generator=generator, dtype=ref.DTYPE)
                     for name, p in params.items()}
            params = ref.adamw_update(params, grads, state, step, lr, optim)
            torch_params[0].grad, torch_params[1].grad = grads["matrix"], grads["vector"]
            torch_optimizer.step()
        for name, torch_param in zip(["matrix", "vector"], torch_params):
            torch.testing.assert_close(params[name], torch_param.detach(), rtol=1e-14, atol=1e-15)


class DropoutMaskTest(unittest.TestCase):
    def test_philox_matches_random123_known_answers(self):
        # Random123 tests/kat_vectors, "philox4x32 10": counter, key -> output.
        vectors = [([0, 0, 0, 0], [0, 0], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
                   ([0xffffffff] * 4, [0xffffffff] * 2,
                    [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
                   ([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0],
                    [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1])]
        for counter, key, expected in vectors:
            self.assertEqual([int(w) for w in dropout_masks.philox4x32_10(counter, key)], expected)

    def test_mapping_matches_the_cpp_known_answers(self):
        # The same values as tests/unit/test_dropout.cpp: keys, and uniforms of (sample, element),
        # the last with both above 2^32 so the high counter words are used.
        key = dropout_masks.stream_key(1234, "dropout/attention/layer0")
        self.assertEqual(key, (0x2092ce47, 0x490cfe60))
        key_mlp = dropout_masks.stream_key(1234, "dropout/hidden_mlp/layer1")
        self.assertEqual(key_mlp, (0x9c7408e9, 0x4bb4a1f4))
        self.assertEqual(float(dropout_masks.uniform_at(key, 0, 0)),
                         float.fromhex("0x1.889cfaab77a14p-2"))
        self.assertEqual(float(dropout_masks.uniform_at(key, 5, 7)),
                         float.fromhex("0x1.161d03c00b267p-1"))
        self.assertEqual(float(dropout_masks.uniform_at(key_mlp, 0x100000003, 0x200000001)),
                         float.fromhex("0x1.0d5c3e3d8084ep-2"))

    def test_keep_fraction_and_masks_of_other_samples(self):
        # 16 windows x 64 positions x 256 hidden = 2^18 elements: Binomial(n, 0.9) kept, within 6
        # standard deviations; the next step's samples drop both an element with probability p^2.
        p, n = 0.1, 16 * 64 * 256
        mask = dropout_masks.hidden_mask(1234, "hidden_mlp", 0, p, np.arange(16), 64, 256)
        self.assertTrue(np.all((mask == 0.0) | (mask == 1.0 / (1.0 - p))))
        self.assertLessEqual(abs(np.count_nonzero(mask) - n * (1 - p)),
                             6 * math.sqrt(n * p * (1 - p)))
        other = dropout_masks.hidden_mask(1234, "hidden_mlp", 0, p, np.arange(16, 32), 64, 256)
        both = np.count_nonzero((mask == 0) & (other == 0))
        self.assertLessEqual(abs(both - n * p * p), 6 * math.sqrt(n * p * p * (1 - p * p)))

    def test_a_mask_of_ones_is_the_identity(self):
        shape = small_shape()
        params = random_params(shape, seed=4)
        tokens = torch.tensor([[5, 8, 2, 6, 11, 13, 4, 7, 3, 9, 4, 1]])
        positions, documents = torch.arange(12)[None], torch.zeros(1, 12, dtype=torch.int64)
        ones = [{"attention": torch.ones(1, 4, 12, 12, dtype=ref.DTYPE),
                 "hidden_attn": torch.ones(1, 12, 16, dtype=ref.DTYPE),
                 "hidden_mlp": torch.ones(1, 12, 16, dtype=ref.DTYPE)}] * 2
        plain = ref.forward(params, tokens, positions, documents, shape, True)
        with_ones = ref.forward(params, tokens, positions, documents, shape, True, ones)
        self.assertTrue(torch.equal(with_ones, plain))
        masks = [{site: torch.from_numpy(m) for site, m in layer.items()}
                 for layer in dropout_masks.layer_masks(shape, 0.2, 0.2, 1234, np.arange(1))]
        dropped = ref.forward(params, tokens, positions, documents, shape, True, masks)
        self.assertGreater(float((dropped - plain).abs().max()), 1e-3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
