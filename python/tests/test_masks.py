"""touchstone.masks: every form of the mask equals the rule, checked element by element."""

import numpy as np
import pytest
import torch

from touchstone import GoldenFile, attention_allowed, cu_seqlens, hf_attention_mask, sdpa_attention_mask

IDS = np.array([[0, 0, 0, 1, 1, -1, -1, -1],
                [2, 2, 2, 2, 2, 2, 3, 3]])


def rule(ids, i, j, masking):
    return j <= i and (not masking or ids[i] == ids[j])


@pytest.mark.parametrize("masking", [True, False])
def test_allowed_is_the_rule(masking):
    allowed = attention_allowed(IDS, masking)
    for b in range(2):
        for i in range(8):
            for j in range(8):
                assert allowed[b, i, j] == rule(IDS[b], i, j, masking)
    assert allowed[:, range(8), range(8)].all()  # every row has itself: no empty softmax


def test_hf_mask_is_additive():
    mask = hf_attention_mask(IDS, True, torch.float64)
    assert mask.shape == (2, 1, 8, 8) and mask.dtype == torch.float64
    allowed = torch.from_numpy(attention_allowed(IDS, True))
    assert (mask[:, 0][allowed] == 0).all()
    assert (mask[:, 0][~allowed] == torch.finfo(torch.float64).min).all()
    assert hf_attention_mask(IDS, True, torch.bfloat16).min() == torch.finfo(torch.bfloat16).min


def test_sdpa_mask_is_boolean_true_where_allowed():
    mask = sdpa_attention_mask(IDS, True)
    assert mask.dtype == torch.bool and mask.shape == (2, 1, 8, 8)
    assert torch.equal(mask[:, 0], torch.from_numpy(attention_allowed(IDS, True)))


def test_cu_seqlens():
    starts, longest = cu_seqlens(IDS, True)
    assert starts.dtype == np.int32
    assert starts.tolist() == [0, 3, 5, 8, 14, 16] and longest == 6
    starts, longest = cu_seqlens(IDS, False)
    assert starts.tolist() == [0, 8, 16] and longest == 8
    with pytest.raises(ValueError, match="window 0 holds a document in two separate runs"):
        cu_seqlens(np.array([[0, 0, 1, 0]]), True)


def test_cu_seqlens_reproduces_the_mask_of_golden_batches(golden_files):
    """Attention inside each cu_seqlens sequence, causal, is exactly the document mask."""
    with GoldenFile(golden_files["default"]) as golden:
        ids = golden.batch(1).document_ids
        B, T = ids.shape
        starts, _ = cu_seqlens(ids, True)
        sequence = np.zeros(B * T, dtype=np.int64)
        for k in range(len(starts) - 1):
            sequence[starts[k]:starts[k + 1]] = k
        sequence = sequence.reshape(B, T)
        from_seqlens = (sequence[:, :, None] == sequence[:, None, :]) & np.tril(np.ones((T, T), bool))
        assert np.array_equal(from_seqlens, attention_allowed(ids, True))


def test_bad_document_ids():
    with pytest.raises(ValueError, match=r"integer array \[B, T\]"):
        attention_allowed(np.zeros(8))
    with pytest.raises(ValueError, match="integer array"):
        attention_allowed(np.zeros((2, 8)))


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="document_ids: a torch.sparse_coo tensor"):
        attention_allowed(torch.from_numpy(IDS).to_sparse())
    with pytest.raises(ValueError, match="document_ids: a meta tensor"):
        cu_seqlens(torch.zeros(2, 8, dtype=torch.int64, device="meta"))
    with pytest.raises(ValueError, match="document_ids: is not an array of numbers"):
        attention_allowed([[0, 1], [1]])
    with pytest.raises(ValueError, match="document_masking must be True or False, not 'false'"):
        sdpa_attention_mask(IDS, "false")
    with pytest.raises(ValueError, match="dtype must be a torch floating-point dtype"):
        hf_attention_mask(IDS, True, torch.int64)
