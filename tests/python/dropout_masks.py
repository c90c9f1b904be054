"""Touchstone's dropout masks, written from their documented definition (docs/architecture.md,
"Dropout") with numpy, independently of the C++ code.

The mask of an element is a pure function of the run's seed, the site's stream name, the window's
global sample index k and the element's index e in that sample's global tensor:

  key     = stream_key(train.seed, "dropout/attention/layer{l}" | "dropout/hidden_attn/layer{l}"
                                   | "dropout/hidden_mlp/layer{l}")
  e       = (h * T + i) * T + j        attention probability of global head h, query i, key j
          = i * H + c                  hidden element of position i, hidden index c
  words   = Philox4x32-10(counter = [e//2 mod 2^32, e//2 >> 32, k mod 2^32, k >> 32], key)
  u       = uniform_from_words(words[0], words[1]) for even e, (words[2], words[3]) for odd e
  keep    = u > p, and a kept element is scaled by 1 / (1 - p).

Only numpy and the standard library are used.
"""

import numpy as np

U32 = np.uint64(0xFFFFFFFF)
MULTIPLIER0, MULTIPLIER1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
WEYL0, WEYL1 = 0x9E3779B9, 0xBB67AE85  # golden ratio, sqrt(3) - 1
MASK64 = (1 << 64) - 1


def philox4x32_10(counter, key):
    """Ten rounds of Philox4x32 (Salmon et al., SC'11).

    counter: four integer arrays of one shape (each word < 2^32); key: two ints < 2^32.
    Returns the four output words as uint64 arrays. Products of two 32-bit words fit in uint64.
    """
    c0, c1, c2, c3 = (np.asarray(word, dtype=np.uint64) for word in counter)
    k0, k1 = int(key[0]), int(key[1])
    for round_index in range(10):
        if round_index > 0:  # the key schedule: add the Weyl constants mod 2^32
            k0, k1 = (k0 + WEYL0) & 0xFFFFFFFF, (k1 + WEYL1) & 0xFFFFFFFF
        product0, product1 = MULTIPLIER0 * c0, MULTIPLIER1 * c2
        hi0, lo0 = product0 >> np.uint64(32), product0 & U32
        hi1, lo1 = product1 >> np.uint64(32), product1 & U32
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
    return c0, c1, c2, c3


def stream_key(seed, name):
    """A 64-bit FNV-1a hash of the name, plus the seed, through the splitmix64 finaliser."""
    value = 0xCBF29CE484222325
    for byte in name.encode("utf-8"):
        value = ((value ^ byte) * 0x100000001B3) & MASK64
    z = (value + 0x9E3779B97F4A7C15 * (seed + 1)) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return z & 0xFFFFFFFF, z >> 32


def uniform_from_words(high, low):
    """Uniform in (0, 1]: the top 53 of the 64 bits (high, low), plus one, times 2^-53."""
    bits53 = ((high << np.uint64(32)) | low) >> np.uint64(11)
    return (bits53.astype(np.float64) + 1.0) * 2.0 ** -53


def uniform_at(key, sample, element):
    """The uniform of element `element` of global sample `sample` (broadcasting integer arrays)."""
    sample, element = np.broadcast_arrays(np.asarray(sample, dtype=np.uint64),
                                          np.asarray(element, dtype=np.uint64))
    block = element >> np.uint64(1)
    w0, w1, w2, w3 = philox4x32_10([block & U32, block >> np.uint64(32), sample & U32,
                                    sample >> np.uint64(32)], key)
    even = (element & np.uint64(1)) == 0
    return np.where(even, uniform_from_words(w0, w1), uniform_from_words(w2, w3))


def keep_scale(key, probability, sample, element):
    """1 / (1 - p) where kept (u > p), 0 where dropped."""
    return np.where(uniform_at(key, sample, element) > probability, 1.0 / (1.0 - probability), 0.0)


def attention_mask(seed, layer, probability, samples, num_heads, seq):
    """keep_scale [B, NH, T, T] of layer `layer`'s attention probabilities; samples: [B]."""
    key = stream_key(seed, f"dropout/attention/layer{layer}")
    element = np.arange(num_heads * seq * seq, dtype=np.uint64).reshape(1, num_heads, seq, seq)
    sample = np.asarray(samples, dtype=np.uint64).reshape(-1, 1, 1, 1)
    return keep_scale(key, probability, sample, element)


def hidden_mask(seed, site, layer, probability, samples, seq, hidden):
    """keep_scale [B, T, H] of a block's output; site is "hidden_attn" or "hidden_mlp"."""
    key = stream_key(seed, f"dropout/{site}/layer{layer}")
    element = np.arange(seq * hidden, dtype=np.uint64).reshape(1, seq, hidden)
    sample = np.asarray(samples, dtype=np.uint64).reshape(-1, 1, 1)
    return keep_scale(key, probability, sample, element)


def layer_masks(shape, attention_p, hidden_p, seed, samples):
    """Every layer's masks {"attention": [B, NH, T, T], "hidden_attn": [B, T, H], "hidden_mlp":
    [B, T, H]} (None where p = 0). shape: torch_reference.ModelShape; samples: [B] global sample
    indices of the batch's windows (step s holds samples (s-1)*B ... s*B-1)."""
    T, H, NH = shape.seq_length, shape.hidden_size, shape.num_heads
    def hidden(site, layer):
        return hidden_mask(seed, site, layer, hidden_p, samples, T, H) if hidden_p > 0 else None

    def attention(layer):
        return attention_mask(seed, layer, attention_p, samples, NH, T) if attention_p > 0 else None

    return [{"attention": attention(layer), "hidden_attn": hidden("hidden_attn", layer),
             "hidden_mlp": hidden("hidden_mlp", layer)} for layer in range(shape.num_layers)]
