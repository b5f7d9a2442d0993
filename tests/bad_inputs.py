"""Bad inputs and the errors the helpers give them: recorded once, checked forever (tests/test_bad_inputs.py).

``python tests/bad_inputs.py record`` runs every probe below against the helpers on PYTHONPATH and
writes tests/bad_input_messages.json: for each probe, the exception's type and message. The record
was made from the code before the checks were shared (issue 29's branch point), so the test proves
that sharing them lost no message.
"""

import json
import sys
from pathlib import Path

RECORD = Path(__file__).with_name("bad_input_messages.json")

PRELUDE = """
import numpy as np
import torch
from helpers.attention import KVCache, MultiHeadAttention, scaled_dot_product_attention, AdditiveAttention
from helpers.masks import causal_mask, padding_mask, padding_mask_from_ids, sliding_window_mask, dilated_mask
from helpers.positional import PositionalEncoding, sinusoidal_encoding, apply_rotary, LearnedPositionalEmbedding
from helpers.transformer import (FeedForward, Transformer, TransformerConfig, EncoderLayer, greedy_decode,
                                 beam_search, greedy_decode_cached)
from helpers.gpt import GPT, GPTConfig, filter_logits
torch.manual_seed(0)
tiny_tf = Transformer(TransformerConfig.tiny(7, 6)).eval()
tiny_gpt = GPT(GPTConfig.tiny(11)).eval()
mha = MultiHeadAttention(16, 4)
x16 = torch.randn(2, 5, 16)
q = torch.randn(2, 3, 8)
"""

PROBES = [
    # attention
    "scaled_dot_product_attention(q, torch.randn(2, 4, 7), torch.randn(2, 4, 8))",
    "scaled_dot_product_attention(q, torch.randn(2, 4, 8), torch.randn(2, 5, 8))",
    "scaled_dot_product_attention(q, q, q, mask=torch.ones(3, 3))",
    "scaled_dot_product_attention(q, q, q, mask=torch.ones(2, 3, 3, dtype=torch.bool)[None])",
    "scaled_dot_product_attention(q, q, q, dropout_p=1.0)",
    "scaled_dot_product_attention(q.long(), q, q)",
    "scaled_dot_product_attention(q, q.double(), q)",
    "scaled_dot_product_attention(q, torch.randn(2, 0, 8), torch.randn(2, 0, 8))",
    "mha(x16, x16, x16, mask=torch.ones(2, 5, dtype=torch.bool))",
    "mha(x16, x16, x16, mask=torch.ones(2, 5, 5, dtype=torch.bool))",
    "mha(torch.randn(2, 5, 15), x16, x16)",
    "mha(x16, x16, x16, need_weights=0)",
    "mha(x16.double(), x16.double(), x16.double())",
    "mha(x16, x16[:, :3], x16)",
    "MultiHeadAttention(16, 3)",
    "MultiHeadAttention(16, 4, n_kv_heads=3)",
    "MultiHeadAttention(16, 4, dropout=1.5)",
    "MultiHeadAttention(0, 4)",
    "mha(x16, x16, x16, cache=object())",
    "mha(x16, x16, x16, cache=mha.new_cache(3, 10))",
    "mha(x16, x16, x16, cache=mha.new_cache(2, 4))",
    "AdditiveAttention(4, 4, 0)",
    # masks and positions
    "causal_mask(0)",
    "causal_mask(2.5)",
    "padding_mask([3, 7], 5)",
    "padding_mask([-1, 2], 5)",
    "padding_mask_from_ids(torch.ones(2, 3), 0)",
    "sliding_window_mask(5, 0)",
    "dilated_mask(5, 2, 0)",
    "PositionalEncoding(8, 4)(torch.randn(1, 5, 8))",
    "PositionalEncoding(8, 4)(torch.randn(1, 3, 6))",
    "LearnedPositionalEmbedding(4, 8)(torch.randn(1, 5, 8))",
    "apply_rotary(torch.randn(2, 3, 5))",
    "apply_rotary(torch.randn(2, 3, 4), positions=torch.arange(4))",
    # the encoder-decoder
    "TransformerConfig(7, 6, d_model=30, n_heads=4)",
    "TransformerConfig(7, 6, dropout=1.0)",
    "TransformerConfig(7, 6, dropout=True)",
    "TransformerConfig(7, 6, pad_id=9)",
    "TransformerConfig(7, 6, norm_first=1)",
    "TransformerConfig(7, 6, activation='tanh')",
    "TransformerConfig(7, 6, layer_norm_eps=0)",
    "TransformerConfig(0, 6)",
    "TransformerConfig(7, 6, d_model=4.0)",
    "FeedForward(8, 16, activation='swish')",
    "FeedForward(8, 16)(torch.randn(2, 3, 7))",
    "FeedForward(8, 0)",
    "tiny_tf(torch.tensor([[3, 4]]), torch.tensor([[1, 9]]))",
    "tiny_tf(torch.tensor([[3, 4]]), torch.tensor([[1.0, 2.0]]))",
    "tiny_tf(torch.tensor([[3, 4]]), torch.tensor([[1, 2]], dtype=torch.int8))",
    "tiny_tf(torch.tensor([3, 4]), torch.tensor([[1, 2]]))",
    "tiny_tf(torch.tensor([[3, 4]]), torch.tensor([[1, 2], [1, 2]]))",
    "tiny_tf(torch.zeros(1, 0, dtype=torch.long), torch.tensor([[1, 2]]))",
    "tiny_tf(torch.ones(1, 65, dtype=torch.long), torch.tensor([[1, 2]]))",
    "tiny_tf.decode(torch.tensor([[1, 2]]), torch.randn(1, 3, 5))",
    "tiny_tf.decode(torch.tensor([[1, 2]]), None)",
    "tiny_tf.decode(torch.tensor([[1, 2]]), torch.randn(1, 3, 32), cache=object())",
    "tiny_tf.new_decode_cache(torch.randn(1, 3, 32), 100)",
    "EncoderLayer(TransformerConfig.tiny(7, 6))(torch.randn(2, 3, 31))",
    "greedy_decode(tiny_tf, torch.tensor([[3, 4]]), 0, 2, 5)",
    "greedy_decode(tiny_tf, torch.tensor([[3, 4]]), 1, 2, 1)",
    "greedy_decode(tiny_tf, torch.tensor([[3, 4]]), 1, 6, 5)",
    "greedy_decode(tiny_tf, torch.tensor([[3, 4]]), 1, 2, 65)",
    "greedy_decode(tiny_tf, torch.tensor([[3, 4]]), 1.0, 2, 5)",
    "greedy_decode(tiny_gpt, torch.tensor([[3, 4]]), 1, 2, 5)",
    "beam_search(tiny_tf, torch.tensor([[3, 4]]), 1, 2, 5, beam_size=0)",
    "beam_search(tiny_tf, torch.tensor([[3, 4]]), 1, 2, 5, length_penalty=-1)",
    "beam_search(tiny_tf, torch.tensor([[3, 4]]), 1, 2, 5, length_penalty=float('nan'))",
    "greedy_decode_cached(tiny_tf, torch.tensor([[3, 4]]), 1, 2, 5, check_every=0)",
    "greedy_decode_cached(tiny_tf, torch.tensor([[3, 4]]), 1, 2, 5, cuda_graph=True)",
    # the GPT and sampling
    "GPTConfig(11, 16, 3, 2, 32, 8)",
    "GPTConfig(11, 16, 4, 2, 32, 0)",
    "GPTConfig(11, 16, 4, 2, 32, 8, n_kv_heads=3)",
    "GPTConfig(11, 16, 4, 2, 32, 8, dropout=-0.1)",
    "GPTConfig(11, 16, 4, 2, 32, 8, tie_weights=1)",
    "GPTConfig(True, 16, 4, 2, 32, 8)",
    "GPT({'vocab_size': 3})",
    "tiny_gpt(torch.tensor([[1, 11]]))",
    "tiny_gpt(torch.zeros(1, 33, dtype=torch.long))",
    "tiny_gpt(torch.zeros(1, 3))",
    "tiny_gpt.generate(torch.zeros(1, 3, dtype=torch.long), -1)",
    "tiny_gpt.generate(torch.zeros(1, 3, dtype=torch.long), 2, temperature=0)",
    "tiny_gpt.generate(torch.zeros(1, 3, dtype=torch.long), 2, top_k=0)",
    "tiny_gpt.generate(torch.zeros(1, 3, dtype=torch.long), 2, top_p=0.0)",
    "tiny_gpt.generate(torch.zeros(1, 3, dtype=torch.long), 2, generator=1)",
    "tiny_gpt.generate(torch.zeros(1, 3, dtype=torch.long), 2, use_cache=1)",
    "filter_logits(torch.zeros(5, dtype=torch.long))",
    "filter_logits(torch.zeros(5), temperature=float('inf'))",
    "filter_logits(torch.zeros(5), top_p=1.5)",
    "filter_logits(torch.zeros(5), top_k=2.0)",
    "filter_logits([1.0, 2.0])",
]


def run(probe: str, env: dict):
    try:
        exec(probe, env)
    except Exception as error:  # noqa: BLE001 (the record is of whatever the helpers raise)
        return type(error).__name__, str(error)
    return None, None


def probe_results() -> dict:
    env = {}
    exec(PRELUDE, env)
    return {probe: run(probe, dict(env)) for probe in PROBES}


if __name__ == "__main__" and sys.argv[1:] == ["record"]:
    results = {p: {"error": e, "message": m} for p, (e, m) in probe_results().items()}
    RECORD.write_text(json.dumps(results, indent=1) + "\n")
    print(f"recorded {len(results)} probes, {sum(r['error'] is not None for r in results.values())} raise")
