"""What a lesson derives in code equals the helper that later lessons import in its place.

A lesson builds a piece (a mask, an attention function, a layer, a decoder, the tiled flash
forward and backward) and later lessons import the same piece from ``helpers``. Each test here
runs the lesson's own definition, read from the notebook's source (not from the solutions), and
the helper on the same random inputs (float64 unless the lesson's piece fixes another dtype), so
that neither can drift from the other unnoticed. Where a lesson's version is simpler (no stop at
</s>, no check of its input), the two are compared on the inputs the lesson's version is meant for.
Lesson 10's Triton kernel is compared with the helper's in tests/test_flash.py.
"""

from __future__ import annotations

import ast
import functools
import json
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from helpers.attention import MultiHeadAttention, scaled_dot_product_attention, softmax
from helpers.data import Vocab
from helpers.decoding import beam_search, generate, greedy_decode, greedy_decode_cached
from helpers.device import attention_flops
from helpers.flash import flash_attention_backward, flash_attention_forward
from helpers.gpt import GPT, GPTConfig
from helpers.heads import induction_score, previous_token_score
from helpers.layers import FeedForward, Residual
from helpers.masks import causal_mask, dilated_mask, padding_mask, sliding_window_mask
from helpers.positional import apply_rotary, sinusoidal_encoding
from helpers.pretrained import WordPieceTokenizer, load_safetensors
from helpers.transformer import DecoderLayer, EncoderLayer, Transformer, TransformerConfig

ROOT = Path(__file__).resolve().parents[1]
DT = torch.float64
PAD, BOS, EOS = 0, 1, 2  # TransformerConfig's defaults


# --- the lesson's definition, from the notebook's source ---------------------------------------------

@functools.cache
def _code_cells(notebook: str) -> tuple[ast.Module, ...]:
    """The parsed code cells of notebooks/<notebook>.ipynb; IPython's % and ! lines left out."""
    cells = json.loads((ROOT / "notebooks" / f"{notebook}.ipynb").read_text(encoding="utf-8"))["cells"]
    out = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        out.append(ast.parse("\n".join(lines)))
    return tuple(out)


def _defines(node: ast.stmt, names) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name in names
    if isinstance(node, ast.Assign):
        return all(isinstance(t, ast.Name) and t.id in names for t in node.targets)
    return False


def _is_stub(node: ast.stmt) -> bool:
    """An exercise left for the learner: a function whose body (docstring aside) only returns None."""
    if not isinstance(node, ast.FunctionDef):
        return False
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Return) and \
        (body[0].value is None or isinstance(body[0].value, ast.Constant) and body[0].value.value is None)


def lesson(notebook: str, name: str, constants=()) -> tuple[object, dict]:
    """The object the lesson names ``name`` where it first defines it, and the namespace it lives in.

    Runs the notebook's imports and its function and class definitions (and the assignments to the
    names in ``constants``), cell by cell, up to the cell that defines ``name``; nothing else of the
    lesson runs (no training, no plots). A definition that needs a value the lesson computes at run
    time gets it from the test, in the namespace returned.
    """
    namespace = {"__name__": f"lesson_{notebook}"}
    for tree in _code_cells(notebook):
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)) or \
                    _defines(node, constants):
                code = compile(ast.Module([node], type_ignores=[]), f"notebooks/{notebook}.ipynb", "exec")
                try:
                    exec(code, namespace)
                except NameError:  # a default or base computed by a cell that did not run here
                    if _defines(node, {name}):
                        raise
        definition = next((node for node in tree.body if _defines(node, {name})), None)
        if definition is not None:
            assert not _is_stub(definition), f"{notebook}'s {name} is an exercise stub, not a derivation"
            return namespace[name], namespace
    raise AssertionError(f"notebooks/{notebook}.ipynb defines no {name}")


# --- random inputs --------------------------------------------------------------------------------------

def randn(g, *shape, dtype=DT):
    return torch.randn(*shape, generator=g, dtype=dtype)


def some_mask(g, *shape, every_row=True):
    """A random boolean mask, True = may attend; with ``every_row`` each row keeps at least one key."""
    m = torch.rand(*shape, generator=g) > 0.4
    if every_row:
        m[..., torch.randint(shape[-1], (), generator=g)] = True
    return m


def close(got, expected, atol=1e-12):
    torch.testing.assert_close(got, expected, atol=atol, rtol=0, equal_nan=False)


def same_until_eos(lesson_ids, helper_ids):
    """The lesson's decoder does not stop at </s>; up to each row's first </s> (or everywhere) they agree."""
    assert lesson_ids.shape[0] == helper_ids.shape[0]
    for mine, theirs in zip(lesson_ids.tolist(), helper_ids.tolist(), strict=True):
        ended = EOS in theirs[1:]
        cut = theirs.index(EOS, 1) + 1 if ended else len(theirs)
        assert all(t == PAD for t in theirs[cut:]), theirs
        if not ended:  # no </s>: the helper ran as long as the lesson's loop
            assert len(mine) == len(theirs)
        assert mine[:cut] == theirs[:cut], (mine, theirs)


def transformer(g_seed, norm_first=True, tgt_v=7, **overrides):
    torch.manual_seed(g_seed)
    model = Transformer(TransformerConfig.tiny(9, tgt_v, norm_first=norm_first, **overrides)).to(DT).eval()
    with torch.no_grad():
        model.head.weight.mul_(4.0)  # sharper next-token distributions: decoding choices are clear-cut
    return model


def source_ids(g, B, S, V=9):
    src = torch.randint(3, V, (B, S), generator=g)  # (B, S)
    src[0, max(1, S - 2):] = PAD  # a shorter first row
    return src


# --- one comparison per lesson piece: (lesson's object, its namespace, helper, hypothesis data) ----------------

def attention_torch(fn, ns, helper, data, g):
    B, T, S, D, Dv = (data.draw(st.integers(1, 6)) for _ in range(5))
    q, k, v = randn(g, B, T, D), randn(g, B, S, D), randn(g, B, S, Dv)
    for got, expected in zip(fn(q, k, v), helper(q, k, v), strict=True):
        close(got, expected)


def attention_numpy(fn, ns, helper, data, g):
    T, S, D = (data.draw(st.integers(1, 6)) for _ in range(3))
    q, k, v = randn(g, T, D), randn(g, S, D), randn(g, S, D)
    for got, expected in zip(fn(q.numpy(), k.numpy(), v.numpy()), helper(q, k, v), strict=True):
        close(torch.from_numpy(np.asarray(got)), expected)


def softmax_of(scale):
    def compare(fn, ns, helper, data, g):
        shape = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
        x = scale * randn(g, *shape)
        close(fn(x), helper(x, dim=-1))
    return compare


def stable_softmax(fn, ns, helper, data, g):
    shape = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = 300.0 * randn(g, *shape)  # large enough that exp overflows without the shift
    close(fn(x, dim=dim), helper(x, dim=dim))


def multi_head(with_mask):
    def compare(fn, ns, helper, data, g):
        H, Dh, B, T, S = (data.draw(st.integers(1, 4)) for _ in range(5))
        torch.manual_seed(data.draw(st.integers(0, 10_000)))
        mine = fn(H * Dh, H).to(DT).eval()
        theirs = helper(H * Dh, H).to(DT).eval()
        theirs.load_state_dict(mine.state_dict())  # the same parameter names: w_q, w_k, w_v, w_o
        x, mem = randn(g, B, T, H * Dh), randn(g, B, S, H * Dh)
        if with_mask:
            mask = some_mask(g, B, 1, T, S)
            pairs = zip(mine(x, mem, mem, mask), theirs(x, mem, mem, mask=mask), strict=True)
        else:
            pairs = zip(mine(x, mem, mem), theirs(x, mem, mem), strict=True)
        for got, expected in pairs:
            close(got, expected)
    return compare


def causal_mask_v1(fn, ns, helper, data, g):
    T = data.draw(st.integers(1, 40))
    assert torch.equal(fn(T), helper(T))


def padding_mask_v1(fn, ns, helper, data, g):
    S = data.draw(st.integers(1, 10))
    lengths = data.draw(st.lists(st.integers(0, S), min_size=1, max_size=4))
    assert torch.equal(fn(lengths, S), helper(lengths, S))


def masked_attention(every_row, returns_weights):
    def compare(fn, ns, helper, data, g):
        B, H, T, S, D = (data.draw(st.integers(1, 5)) for _ in range(5))
        q, k, v = randn(g, B, H, T, D), randn(g, B, H, S, D), randn(g, B, H, S, D)
        mask = some_mask(g, B, 1, T, S, every_row=every_row)
        got, expected = fn(q, k, v, mask), helper(q, k, v, mask=mask)
        if returns_weights:
            close(got[1], expected[1])
            got = got[0]
        close(got, expected[0])
    return compare


def sinusoidal(fn, ns, helper, data, g):
    length, d_model = data.draw(st.integers(1, 30)), 2 * data.draw(st.integers(1, 12))  # the lesson's even widths
    got, expected = fn(length, d_model), helper(length, d_model)
    assert got.dtype == expected.dtype == torch.float32
    close(got, expected, atol=1e-6)  # float32 tables: the loop and the helper round differently


def rotary(dtype, atol, batched):
    def compare(fn, ns, helper, data, g):
        T, half = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 6))
        lead = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2))) if batched else ()
        x = randn(g, *lead, T, 2 * half, dtype=dtype)
        close(fn(x), helper(x), atol=atol)
    return compare


def ffn(fn, ns, helper, data, g):
    C, d_ff, B, T = (data.draw(st.integers(1, 8)) for _ in range(4))
    torch.manual_seed(data.draw(st.integers(0, 10_000)))
    ff = helper(C, d_ff).to(DT)
    # the weights lesson 07's ffn reads as globals
    ns.update(w1=ff.linear1.weight, b1=ff.linear1.bias, w2=ff.linear2.weight, b2=ff.linear2.bias)
    x = randn(g, B, T, C)
    close(fn(x), ff(x))


def feed_forward_module(fn, ns, helper, data, g):
    C, d_ff, B, T = (data.draw(st.integers(1, 8)) for _ in range(4))
    torch.manual_seed(data.draw(st.integers(0, 10_000)))
    mine, theirs = fn(C, d_ff).to(DT), helper(C, d_ff).to(DT)
    theirs.load_state_dict(mine.state_dict())
    x = randn(g, B, T, C)
    close(mine(x), theirs(x))


def residual(norm_first):
    def compare(fn, ns, helper, data, g):
        C, B, T = (data.draw(st.integers(1, 6)) for _ in range(3))
        torch.manual_seed(data.draw(st.integers(0, 10_000)))
        sublayer = nn.Linear(C, C).to(DT)
        norm = nn.LayerNorm(C).to(DT)
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)

        def dropout(h):
            return 0.5 * h  # stands for the dropout layer: where it sits is what is compared

        x = randn(g, B, T, C)
        close(fn(x, sublayer, norm, dropout), helper(dropout, norm_first)(x, sublayer, norm))
    return compare


def encoder_layer(fn, ns, helper, data, g):
    H, Dh, B, T = (data.draw(st.integers(1, 4)) for _ in range(4))
    norm_first = data.draw(st.booleans())
    cfg = TransformerConfig.tiny(5, 5, d_model=H * Dh, n_heads=H, d_ff=2 * H * Dh, norm_first=norm_first)
    torch.manual_seed(data.draw(st.integers(0, 10_000)))
    mine = fn(cfg.d_model, H, cfg.d_ff, dropout=0.0, norm_first=norm_first).to(DT).eval()
    theirs = helper(cfg).to(DT).eval()
    theirs.load_state_dict(mine.state_dict())
    x, keep = randn(g, B, T, cfg.d_model), some_mask(g, B, 1, 1, T)
    close(mine(x, keep), theirs(x, keep))


def decoder_layer(fn, ns, helper, data, g):
    H, Dh, B, T, S = (data.draw(st.integers(1, 4)) for _ in range(5))
    cfg = TransformerConfig.tiny(5, 5, d_model=H * Dh, n_heads=H, d_ff=2 * H * Dh, norm_first=True)  # Pre-LN
    torch.manual_seed(data.draw(st.integers(0, 10_000)))
    mine, theirs = fn(cfg).to(DT).eval(), helper(cfg).to(DT).eval()
    theirs.load_state_dict(mine.state_dict())
    x, memory = randn(g, B, T, cfg.d_model), randn(g, B, S, cfg.d_model)
    self_mask, memory_mask = causal_mask(T), some_mask(g, B, 1, 1, S)
    close(mine(x, memory, self_mask, memory_mask), theirs(x, memory, self_mask, memory_mask))


def encode_v1(fn, ns, helper, data, g):
    ns["PAD"] = PAD  # lesson 08 reads it from its vocabulary
    model = transformer(data.draw(st.integers(0, 10_000)))
    src = source_ids(g, data.draw(st.integers(1, 3)), data.draw(st.integers(1, 8)))
    (memory, keep), (memory_h, keep_h) = fn(model, src), helper(model, src)
    close(memory, memory_h)
    assert torch.equal(keep, keep_h)


def decode_v1(fn, ns, helper, data, g):
    ns["PAD"] = PAD
    model = transformer(data.draw(st.integers(0, 10_000)))
    B, T = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 8))
    src = source_ids(g, B, data.draw(st.integers(1, 8)))
    tgt = torch.randint(3, 7, (B, T), generator=g)
    tgt[:, 0] = BOS
    tgt[0, max(1, T - 2):] = PAD  # a padded target row
    memory, keep = model.encode(src)
    close(fn(model, tgt, memory, keep), helper(model, tgt, memory, keep))


def greedy_v1(fn, ns, helper, data, g):
    ns["BOS"] = BOS
    model = transformer(data.draw(st.integers(0, 10_000)), tgt_v=data.draw(st.integers(4, 8)))
    src = source_ids(g, data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6)))
    max_len = data.draw(st.integers(2, 10))
    same_until_eos(fn(model, src, max_len=max_len), helper(model, src, BOS, EOS, max_len))


def beam_search_v1(fn, ns, helper, data, g):
    ns.update(PAD=PAD, BOS=BOS, EOS=EOS)
    model = transformer(data.draw(st.integers(0, 10_000)), tgt_v=data.draw(st.integers(4, 8)))
    src = source_ids(g, data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6)))
    k, alpha, max_len = data.draw(st.integers(1, 4)), data.draw(st.sampled_from([0.0, 0.6, 2.0])), \
        data.draw(st.integers(2, 8))
    ids, _ = fn(model, src, k=k, alpha=alpha, max_len=max_len)
    assert torch.equal(ids, helper(model, src, BOS, EOS, max_len, beam_size=k, length_penalty=alpha))


def flops_of_attention(fn, ns, helper, data, g):
    B, H, T, S, D = (data.draw(st.integers(1, 5000)) for _ in range(5))
    assert fn(B, H, T, S, D) == helper(B, H, T, S, D)


def greedy_cached(fn, ns, helper, data, g):
    model = transformer(data.draw(st.integers(0, 10_000)), tgt_v=data.draw(st.integers(4, 8)))  # Pre-LN, as lesson 09
    with torch.no_grad():
        # the lesson's cache keeps every generated token visible; the helper hides a generated <pad> from the
        # later queries (as the uncached decoder does): on the inputs the lesson's version is for, no <pad> comes
        model.head.bias[PAD] = -1e4
    src = source_ids(g, data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6)))
    n_new = data.draw(st.integers(1, 9))
    with torch.no_grad():
        mine = fn(model, src, BOS, n_new)
    same_until_eos(mine, helper(model, src, BOS, EOS, n_new + 1))


def window_mask(dilated):
    def compare(fn, ns, helper, data, g):
        T, window = data.draw(st.integers(1, 30)), data.draw(st.integers(1, 8))
        if dilated:
            dilation = data.draw(st.integers(1, 4))
            assert torch.equal(fn(T, window, dilation), helper(T, window, dilation))
        else:
            assert torch.equal(fn(T, window), helper(T, window))
    return compare


def online_softmax(fn, ns, helper, data, g):
    shape = data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=3))
    x = 30.0 * randn(g, *shape)
    x = x.masked_fill(torch.rand(*shape, generator=g) < 0.3, float("-inf"))  # blocked entries, whole rows too
    close(fn(x, data.draw(st.integers(1, shape[-1] + 2))), helper(x, dim=-1))


def flash_inputs(data, g):
    B, H, T, S, D, Dv = (data.draw(st.integers(1, 5)) for _ in range(6))
    T, S = 3 * T, 3 * S  # several tiles
    q, k, v = randn(g, B, H, T, D), randn(g, B, H, S, D), randn(g, B, H, S, Dv)
    mask = data.draw(st.sampled_from(["none", "causal", "random"]))
    if mask == "causal":
        mask = torch.ones(T, S, dtype=torch.bool).tril()[None, None]  # (1, 1, T, S)
    elif mask == "random":
        mask = some_mask(g, B, 1, T, S, every_row=False)  # fully masked rows too
    else:
        mask = None
    blocks = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 8))
    return q, k, v, mask, blocks


def tiled_attention(fn, ns, helper, data, g):
    q, k, v, mask, (bq, bk) = flash_inputs(data, g)
    for got, expected in zip(fn(q, k, v, mask, bq, bk), helper(q, k, v, mask, bq, bk), strict=True):
        close(got, expected)


def tiled_backward(fn, ns, helper, data, g):
    q, k, v, mask, (bq, bk) = flash_inputs(data, g)
    out, lse = flash_attention_forward(q, k, v, mask, bq, bk)
    d_out = randn(g, *out.shape)
    for got, expected in zip(fn(q, k, v, out, lse, d_out, mask, bq, bk),
                             helper(q, k, v, out, lse, d_out, mask, bq, bk), strict=True):
        close(got, expected)


def safetensors_file(tensors: dict, path: Path) -> None:
    """Write ``tensors`` in the safetensors layout: 8-byte header length, JSON header, raw little-endian data."""
    names = {torch.float32: "F32", torch.int64: "I64"}
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        blob = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(fn, ns, helper, data, g):
    shapes = data.draw(st.lists(st.lists(st.integers(1, 4), max_size=3), min_size=1, max_size=4))
    tensors = {f"layer.{i}.{'weight' if i % 2 else 'ids'}": torch.randn(tuple(s), generator=g) if i % 2
               else torch.randint(-5, 5, tuple(s), generator=g) for i, s in enumerate(shapes)}  # 0-d ones too
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        safetensors_file(tensors, path)
        mine, theirs = fn(path), helper(path)
    assert mine.keys() == theirs.keys() == tensors.keys()
    for name, t in tensors.items():
        assert mine[name].dtype == theirs[name].dtype == t.dtype
        assert torch.equal(mine[name], theirs[name]) and torch.equal(theirs[name], t)


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "cats", "##s", "un", "##believ", "##able", "a", "##b",
         "##c", "b", "c", "caf", "##e", ",", ".", "!", "?", "$", "'", "-", "1", "##2", "一", "二", "e"]
# plain text the lesson's simpler tokenizer is meant for: ASCII, accented Latin letters, the main CJK block
TEXT = st.lists(st.sampled_from(list("abcetuns12 ,.!?$'-\t\n") + ["é", "É", "ü", "一", "二", "CAT", "Cats"]),
                max_size=40).map("".join)


@functools.cache
def tokenizer() -> WordPieceTokenizer:
    with tempfile.TemporaryDirectory() as tmp:  # the tokenizer reads its vocabulary file once, when made
        path = Path(tmp) / "vocab.txt"
        path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
        return WordPieceTokenizer(path)


def tokenizer_method(method):
    def compare(fn, ns, helper, data, g):
        tok = tokenizer()
        ns["vocab"] = tok.vocab  # lesson 11 reads the model's vocabulary into this global
        text = data.draw(TEXT)
        if method == "wordpiece":
            for word in tok.basic_tokenize(text):
                assert fn(word, tok.vocab) == tok.wordpiece(word), word
        else:
            assert fn(text) == getattr(tok, method)(text), text
    return compare


def gpt_forward(fn, ns, helper, data, g):
    torch.manual_seed(data.draw(st.integers(0, 10_000)))
    model = GPT(GPTConfig.tiny(n_kv_heads=None)).to(DT).eval()
    ids = torch.randint(0, model.config.vocab_size, (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 12))),
                        generator=g)
    with torch.no_grad():
        close(fn(model, ids), helper(model, ids))


def my_generate(fn, ns, helper, data, g):
    torch.manual_seed(data.draw(st.integers(0, 10_000)))
    vocab = Vocab("abcdefgh")  # 3 special tokens + 8 characters: GPTConfig.tiny's 11 ids
    ns["vocab"] = vocab  # lesson 12's sampler reads the special ids from this global
    special_ids = (vocab.pad_id, vocab.bos_id, vocab.eos_id)
    model = GPT(GPTConfig.tiny(len(vocab), n_kv_heads=None, special_ids=special_ids)).to(DT).eval()
    with torch.no_grad():
        model.embed.weight.mul_(20.0)  # lively logits: the samples depend on every step's distribution
        model.head.weight[list(special_ids)] *= 10.0  # the special ids would be sampled often if not removed
    ids = torch.randint(0, model.config.vocab_size, (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6))),
                        generator=g)
    knobs = dict(temperature=data.draw(st.sampled_from([0.5, 1.0, 2.0])),
                 top_k=data.draw(st.sampled_from([None, 1, 3])), top_p=data.draw(st.sampled_from([None, 0.7])))
    n, seed = data.draw(st.integers(0, 20)), data.draw(st.integers(0, 10_000))  # within max_len=32: no crop
    mine = fn(model, ids, n, torch.Generator().manual_seed(seed), **knobs)
    for use_cache in (False, True):
        theirs = helper(model, ids, n, **knobs, generator=torch.Generator().manual_seed(seed), use_cache=use_cache)
        assert torch.equal(mine, theirs), use_cache


def head_score(induction):
    def compare(fn, ns, helper, data, g):
        B, H, T = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4)), data.draw(st.integers(2, 10))
        w = torch.softmax(randn(g, B, H, T, T).masked_fill(~causal_mask(T), float("-inf")), dim=-1)
        if induction:
            p = data.draw(st.integers(1, T - 1))
            got, expected = fn(w, p), helper(w, p)
        else:
            got, expected = fn(w), helper(w)
        close(got.to(DT), expected, atol=1e-12 if got.dtype == DT else 1e-6)
    return compare


# (notebook, the lesson's name, the helper it equals, how they are compared)
PAIRS = [
    ("02_queries_keys_values", "attention_numpy", scaled_dot_product_attention, attention_numpy),
    ("02_queries_keys_values", "attention_torch", scaled_dot_product_attention, attention_torch),
    ("03_scaling_and_softmax", "naive_softmax", softmax, softmax_of(3.0)),  # no shift: moderate scores only
    ("03_scaling_and_softmax", "stable_softmax", softmax, stable_softmax),
    ("04_multi_head_attention", "MultiHeadLoop", MultiHeadAttention, multi_head(with_mask=False)),
    ("04_multi_head_attention", "MultiHeadBatched", MultiHeadAttention, multi_head(with_mask=True)),
    ("05_masking", "causal_mask_v1", causal_mask, causal_mask_v1),
    ("05_masking", "masked_attention", scaled_dot_product_attention, masked_attention(False, True)),
    ("05_masking", "padding_mask_v1", padding_mask, padding_mask_v1),
    ("05_masking", "naive_attention", scaled_dot_product_attention, masked_attention(True, False)),  # NaN otherwise
    ("06_positional_encoding", "sinusoidal_loop", sinusoidal_encoding, sinusoidal),
    ("06_positional_encoding", "sinusoidal_vectorised", sinusoidal_encoding, sinusoidal),
    ("06_positional_encoding", "rotary_loop", apply_rotary, rotary(torch.float32, 1e-5, batched=False)),
    ("06_positional_encoding", "rotary_vectorised", apply_rotary, rotary(DT, 1e-12, batched=True)),
    ("06_positional_encoding", "rotary_complex", apply_rotary, rotary(DT, 1e-12, batched=False)),
    ("07_transformer_block", "ffn", FeedForward, ffn),
    ("07_transformer_block", "FeedForwardV1", FeedForward, feed_forward_module),
    ("07_transformer_block", "post_ln", Residual, residual(norm_first=False)),
    ("07_transformer_block", "pre_ln", Residual, residual(norm_first=True)),
    ("07_transformer_block", "MyEncoderLayer", EncoderLayer, encoder_layer),
    ("08_encoder_decoder", "DecoderLayerV1", DecoderLayer, decoder_layer),
    ("08_encoder_decoder", "encode_v1", Transformer.encode, encode_v1),
    ("08_encoder_decoder", "decode_v1", Transformer.decode, decode_v1),
    ("08_encoder_decoder", "greedy_v1", greedy_decode, greedy_v1),
    ("08_encoder_decoder", "beam_search_v1", beam_search, beam_search_v1),
    ("09_attention_at_scale", "flops_of_attention", attention_flops, flops_of_attention),
    ("09_attention_at_scale", "greedy_cached", greedy_decode_cached, greedy_cached),
    ("09_attention_at_scale", "sliding_window_loop", sliding_window_mask, window_mask(dilated=False)),
    ("09_attention_at_scale", "sliding_window", sliding_window_mask, window_mask(dilated=False)),
    ("09_attention_at_scale", "dilated_loop", dilated_mask, window_mask(dilated=True)),
    ("09_attention_at_scale", "dilated", dilated_mask, window_mask(dilated=True)),
    ("10_flash_attention", "online_softmax", softmax, online_softmax),
    ("10_flash_attention", "tiled_attention", flash_attention_forward, tiled_attention),
    ("10_flash_attention", "tiled_backward", flash_attention_backward, tiled_backward),
    ("11_pretrained_model", "read_safetensors", load_safetensors, read_safetensors),
    ("11_pretrained_model", "basic_tokenize", WordPieceTokenizer.basic_tokenize, tokenizer_method("basic_tokenize")),
    ("11_pretrained_model", "wordpiece", WordPieceTokenizer.wordpiece, tokenizer_method("wordpiece")),
    ("11_pretrained_model", "encode", WordPieceTokenizer.encode, tokenizer_method("encode")),
    ("12_gpt_from_scratch", "gpt_forward", GPT.forward, gpt_forward),
    ("12_gpt_from_scratch", "torch_gpt", GPT.forward, gpt_forward),
    ("12_gpt_from_scratch", "my_generate", generate, my_generate),
    ("13_induction_heads", "prev_score_loop", previous_token_score, head_score(induction=False)),
    ("13_induction_heads", "induction_score_loop", induction_score, head_score(induction=True)),
]
CONSTANTS = {"read_safetensors": ("DTYPES",)}


@pytest.mark.parametrize("notebook, name, helper, compare",
                         [pytest.param(*p, id=f"{p[0][:2]}-{p[1]}") for p in PAIRS])
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_the_lessons_definition_equals_the_helper(notebook, name, helper, compare, data):
    fn, namespace = lesson(notebook, name, CONSTANTS.get(name, ()))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    compare(fn, namespace, helper, data, g)


def test_the_loader_runs_only_definitions_and_refuses_stubs():
    """The lesson's cells that train, plot or print never run here; an exercise stub is no derivation."""
    fn, namespace = lesson("10_flash_attention", "tiled_attention")
    assert callable(fn) and "fold_tile" in namespace and "B" not in namespace  # B = 2 is set by a cell, not run
    with pytest.raises(AssertionError, match="exercise stub"):
        lesson("10_flash_attention", "causal_flash_attention")
    with pytest.raises(AssertionError, match="defines no no_such_piece"):
        lesson("10_flash_attention", "no_such_piece")


def test_each_lesson_piece_is_compared_once():
    assert len({(notebook, name) for notebook, name, _, _ in PAIRS}) == len(PAIRS)
