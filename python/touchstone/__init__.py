"""Touchstone's Python package: golden files in, candidates out, for PyTorch and Hugging Face runs.

- `touchstone.golden`: read a golden file (config, initial parameters, batches cut into micro-batches
  in Megatron-LM's order, expected values), tensor by tensor.
- `touchstone.candidate`: write another trainer's run in the golden layout for `touchstone diff`.
- `touchstone.masks`: the attention masks each framework wants (HF additive 4-D, boolean for SDPA,
  `cu_seqlens` for packed kernels).
- `touchstone.loss`: the golden objective from logits (torch).
- `touchstone.hf`: Hugging Face Llama names, layouts and config both ways, `exact_fp64`.
- `touchstone.megatron`: Megatron-Core itself replaying a golden file on the CPU (imported on its own:
  it needs torch and Megatron-Core).

numpy and h5py are required; torch, safetensors and transformers only by the functions that use them.
Bad input is a ValueError with a one-line message naming the file, key or tensor.
"""

from touchstone.h5py_import import import_h5py

import_h5py()  # first: an h5py built against another numpy is explained in one line, not deep inside h5py

from touchstone.candidate import CandidateWriter
from touchstone.golden import FORMAT_VERSION, Batch, Expected, GoldenFile, MicroBatch, parameter_names
from touchstone.masks import attention_allowed, cu_seqlens, hf_attention_mask, sdpa_attention_mask

__version__ = "0.1.0"

__all__ = ["CandidateWriter", "GoldenFile", "Batch", "MicroBatch", "Expected", "FORMAT_VERSION",
           "parameter_names", "attention_allowed", "cu_seqlens", "hf_attention_mask", "sdpa_attention_mask"]
