"""Scratch builder for lesson 12 (not part of the course): writes the notebook's cells, keeps no outputs."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import nbtools  # noqa: E402

CELLS = []


def md(text, collapsed=False):
    cell = {"cell_type": "markdown", "metadata": {}, "source": text.strip("\n")}
    if collapsed:
        cell["metadata"][nbtools.COLLAPSED] = True
    CELLS.append(cell)


def code(text, tags=()):
    cell = {"cell_type": "code", "metadata": {"tags": list(tags)} if tags else {}, "source": text.strip("\n"),
            "outputs": [], "execution_count": None}
    CELLS.append(cell)


IGNORE = ("nbval-ignore-output",)

md(r"""
# 12 · A GPT from scratch: a decoder-only language model on real English text

Most large language models in use today are *decoder-only* Transformers: one stack of causal
self-attention blocks, trained to predict the next token of ordinary text. The course already has
every piece. This lesson puts them together into a small GPT, watches it learn ten plays of
Shakespeare, scores it honestly, and samples from it for as long as we like.

Learning goals:
- build a decoder-only GPT from the course's own attention, feed-forward and mask, equal to PyTorch's modules;
- train it and watch training and validation bits per character fall past unigram, bigram and trigram baselines;
- score a model honestly: every figure over a whole named split, the test split once, at the end;
- sample with greedy, temperature, top-k and top-p decoding, past the model's context, with and without a KV cache.
""")

code(r"""
import math
import time
from functools import partial

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from helpers.attention import to_torch_mha
from helpers.checks import (
    check_bits_per_char,
    check_cached_step,
    check_predict_cache_bytes,
    check_temperature_sample,
    check_top_p_filter,
)
from helpers.data import Vocab, load_text
from helpers.device import get_device, seed_everything
from helpers.diagrams import gpt_diagram
from helpers.gpt import GPT, GPTConfig, filter_logits, load_course_gpt
from helpers.lm import (
    best_k,
    bits_per_char,
    cosine_factor,
    load_training_log,
    ngram_bits_per_char,
    parameter_count,
    spaced_windows,
    train_lm,
    window_bits,
)
from helpers.plot import heads_grid

seed_everything(0)
device = get_device()
print("device:", device.type)
""")

md(r"""
## 1. From encoder-decoder to decoder-only

Lesson 08's Transformer had two stacks: an encoder read the source, and a decoder wrote the
target while reading the encoder's output through cross-attention. A language model has no
separate source. Its input is the text so far, and its output is a guess at the next token.
So we drop the encoder and the cross-attention, and keep the decoder's causal self-attention.

Training needs no labels: every position of a text is an example. The model reads tokens
`0..t` and is scored on token `t + 1`, for every `t` at once, thanks to the causal mask.
Lesson 11's encoder was the other kind: it attends in both directions and fills in masked
words, so it understands a sentence but cannot write one token after another.
""")

md(r"""
## 2. Real text: ten plays of Shakespeare

The text is in `data/` (its source, licence and checksum are in `data/README.md`). It is cut
into three disjoint parts: `train` (90%) to learn from, `valid` (5%) to compare models and choose
settings, and `test` (5%), which we score exactly once, at the very end, so that no choice we
make can flatter it. Our tokens are single characters.
""")

code(r"""
train_text, valid_text = load_text("train"), load_text("valid")
vocab = Vocab(train_text)
V = len(vocab)
train_ids = torch.tensor(vocab.encode(train_text))  # (N,)
valid_ids = torch.tensor(vocab.encode(valid_text))
print(f"train: {len(train_text):,} characters, valid: {len(valid_text):,}; V = {V} "
      "(3 special tokens, never sampled, + 67 characters)")
print(train_text[:220])
""")

md(r"""
## 3. Three baselines: counting characters

We measure every model in **bits per character** (bpc): the mean of
$-\log_2 p(\text{next character})$ over every character of a split. Lower is better; a uniform
guess over 67 characters costs $\log_2 67 \approx 6.07$ bits.

Three counting models set the bar. The *unigram* predicts each character by its frequency, the
*bigram* from the one character before it, the *trigram* from the two before it. Each count gets
$k$ added, so a pair never seen in training still gets a small probability:
$p(c \mid \text{context}) = (n(\text{context}, c) + k) / (n(\text{context}) + kV)$.
Unigram and bigram use $k = 1$. For the trigram, most of the $67^3$ triples are never seen, and
$k = 1$ would give them too much; we choose $k$ on `valid`.
""")

code(r"""
counts = torch.bincount(train_ids, minlength=V).double() + 1  # (V,)
unigram = -(counts / counts.sum()).log2()[valid_ids[1:]].mean().item()
pairs = torch.zeros(V, V, dtype=torch.float64)
pairs.index_put_((train_ids[:-1], train_ids[1:]), torch.ones(len(train_ids) - 1, dtype=torch.float64),
                 accumulate=True)  # (V, V): row = previous character
pairs += 1
# the first position has one character of context: the bigram scores it in both models
bigram = -(pairs / pairs.sum(1, keepdim=True)).log2()[valid_ids[:-1], valid_ids[1:]].mean().item()
assert abs(unigram - ngram_bits_per_char(train_ids, valid_ids, V, 1)) < 1e-9
assert abs(bigram - ngram_bits_per_char(train_ids, valid_ids, V, 2)) < 1e-9

ks = (0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 1.0)
k3, trigram = best_k(train_ids, valid_ids, V, 3, ks)
trigram_k1 = ngram_bits_per_char(train_ids, valid_ids, V, 3, k=1.0)
baselines = {"unigram": unigram, "bigram": bigram, f"trigram (k = {k3})": trigram}
for name, bits in baselines.items():
    print(f"{name:17} {bits:.2f} bits per character on the whole valid split")
print(f"(the trigram with k = 1 would score {trigram_k1:.2f})")
assert 4.7 < unigram < 5.0 and 3.4 < bigram < 3.7 and 2.9 < trigram < trigram_k1 < 3.05
""")

md(r"""
## 4. The model

A GPT is a short list of parts, all from earlier lessons:

1. a token embedding (V, C) and a learned position table (max_len, C), added (lesson 06);
2. N Pre-LN blocks: `x + attention(LayerNorm(x))` with a causal mask, then
   `x + feed-forward(LayerNorm(x))` (lessons 04, 05 and 07);
3. a final LayerNorm, because a Pre-LN stack leaves its output unnormalised;
4. an output layer that reuses the embedding matrix, transposed. This is *weight tying*
   (Press & Wolf 2017): a character's input vector also scores it as an output.

The course ships a model of this kind, trained by `data/train_gpt.py`, with a log of its
training. The log holds the recipe, so we build the same model here and later train it the same way.
""")

code(r"""
full = load_training_log()
recipe = full["recipe"]
config = GPTConfig(**{k: v for k, v in full["config"].items() if k in ("vocab_size", "d_model", "n_heads",
                                                                      "n_layers", "d_ff", "max_len", "dropout")})
assert config.vocab_size == V
print({k: recipe[k] for k in ("seed", "steps", "batch_size", "lr", "warmup", "weight_decay", "dropout")})
fig = gpt_diagram(config)
plt.show()
""")

md(r"""
The forward pass, written out with the model's own modules, fits in a few lines.
""")

code(r"""
def gpt_forward(model, ids):
    B, T = ids.shape
    x = model.embed(ids) + model.pos.table.weight[:T]  # (B, T, C)
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]  # (1, 1, T, T), True = may attend
    for block in model.blocks:
        h = block.norm1(x)
        x = x + block.attn(h, h, h, mask=mask)[0]  # (B, T, C)
        x = x + block.ff(block.norm2(x))  # (B, T, C)
    return model.norm(x) @ model.embed.weight.T  # (B, T, C) @ (C, V) -> (B, T, V)


model = GPT(config)
ids = train_ids[:40].view(2, 20)  # (B, T) = (2, 20)
logits = model(ids)
assert logits.shape == (2, 20, V)
assert torch.allclose(gpt_forward(model, ids), logits, atol=1e-5)
assert model.head.weight is model.embed.weight  # tied: one matrix
print("logits", tuple(logits.shape))
""")

md(r"""
**Counting the parameters.** Per block: four attention projections of $C^2 + C$ each, the
feed-forward's $2 C d_{ff} + d_{ff} + C$, and two LayerNorms of $2C$. Around the blocks: the
embedding $VC$, the position table $LC$ and the final norm $2C$. The tied output adds nothing.
""")

code(r"""
C, F_, L, n = config.d_model, config.d_ff, config.max_len, config.n_layers
by_formula = V * C + L * C + n * (4 * (C * C + C) + 2 * C * F_ + F_ + C + 4 * C) + 2 * C
by_module = sum(p.numel() for p in model.parameters())
assert by_formula == by_module == parameter_count(config)
print(f"{by_module:,} parameters; an untied output layer would add {V * C:,}")
""")

md(r"""
**The same computation from PyTorch's modules.** `nn.TransformerEncoderLayer` with
`norm_first=True` is a Pre-LN block. With our weights copied in, a stack of them plus the
embedding and the final norm must give the same logits, in float64 to 1e-10.
""")

code(r"""
def torch_gpt(model, ids):
    cfg, T = model.config, ids.shape[1]
    x = F.embedding(ids, model.embed.weight) + model.pos.table.weight[:T]
    blocked = torch.ones(T, T, dtype=torch.bool).triu(1)  # PyTorch's polarity: True = may NOT attend
    for block in model.blocks:
        layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True, dtype=torch.float64).eval()
        layer.self_attn = to_torch_mha(block.attn)
        with torch.no_grad():
            for mine, theirs in ((block.ff.linear1, layer.linear1), (block.ff.linear2, layer.linear2),
                                 (block.norm1, layer.norm1), (block.norm2, layer.norm2)):
                theirs.weight.copy_(mine.weight)
                theirs.bias.copy_(mine.bias)
        x = layer(x, src_mask=blocked)
    return F.layer_norm(x, (cfg.d_model,), model.norm.weight, model.norm.bias) @ model.embed.weight.T


model64 = GPT(config).double().eval()
diff = (model64(ids) - torch_gpt(model64, ids)).abs().max().item()
assert diff < 1e-10
print("largest difference from PyTorch's modules < 1e-10:", diff < 1e-10)
""")

md(r"""
**Causality.** Changing the character at position `t` must leave every logit before `t` exactly
as it was, and must change the logits from `t` on.
""")

code(r"""
t = 12
changed = ids.clone()
changed[:, t] = (changed[:, t] + 1) % V
a, b = model64(ids), model64(changed)
assert torch.equal(a[:, :t], b[:, :t]) and not torch.equal(a[:, t:], b[:, t:])
print(f"logits before position {t} unchanged: True; from position {t} on: changed")
""")

md(r"""
## 5. Watch it learn

Each training step takes 32 random windows of 128 characters and the same windows shifted by one
as the targets, and lowers their mean cross-entropy with AdamW. The learning rate warms up for
100 steps, then decays along a cosine, and gradients are clipped to norm 1.

We run the recipe's first 100 steps live, from the same seed, so the weights start where
the shipped model's started and see the same batches. Every 50 steps we score the model on 64
fixed windows of `train` and of `valid`, spread evenly over each split, exactly as the log did.
""")

code(r"""
LIVE_STEPS = 100
torch.manual_seed(recipe["seed"])  # the recipe's initial weights ...
live = GPT(config).to(device)
optimizer = torch.optim.AdamW(live.parameters(), lr=recipe["lr"], betas=(0.9, recipe["beta2"]),
                              weight_decay=recipe["weight_decay"])
schedule = torch.optim.lr_scheduler.LambdaLR(  # ... its schedule over its full length ...
    optimizer, lambda s: cosine_factor(s, recipe["steps"], recipe["warmup"], recipe["lr_floor"]))
batches = torch.Generator().manual_seed(recipe["seed"])  # ... and its batches
log_sets = {split: spaced_windows(split_ids, config.max_len, recipe["log_windows"])
            for split, split_ids in (("train", train_ids), ("valid", valid_ids))}


def evaluate(m):
    return {f"{split}_bits": window_bits(m, x, y) for split, (x, y) in log_sets.items()}


start = time.perf_counter()
live_log = train_lm(live, optimizer, schedule, train_ids, LIVE_STEPS, recipe["batch_size"], batches,
                    log_every=recipe["log_every"], evaluate=evaluate, clip=recipe["clip"], desc="live GPT")
live_seconds = time.perf_counter() - start
""", IGNORE)

code(r"""
logged = {e["step"]: e for e in full["log"]}
for entry in live_log:
    old = logged[entry["step"]]
    print(f"step {entry['step']:4}: valid {entry['valid_bits']:.2f} bits live, {old['valid_bits']:.2f} in the log")
    # the same arithmetic on another CPU rounds differently; the curves agree to a few hundredths
    assert abs(entry["valid_bits"] - old["valid_bits"]) < 0.05 and abs(entry["train_bits"] - old["train_bits"]) < 0.05
print(f"{LIVE_STEPS} steps in {live_seconds:.0f} s")
""", IGNORE)

md(r"""
The live run lies on the logged curve: same seed, same batches, same arithmetic. The full run went
on for thousands of steps. Here are both, with the three baselines on the same `valid` split.
""")

code(r"""
steps = [e["step"] for e in full["log"]]
fig, ax = plt.subplots(figsize=(9, 4.5))
ax.plot(steps, [e["train_bits"] for e in full["log"]], color="C0", lw=1, label="full run: train windows")
ax.plot(steps, [e["valid_bits"] for e in full["log"]], color="C1", lw=1, label="full run: valid windows")
ax.plot([e["step"] for e in live_log], [e["valid_bits"] for e in live_log], "o", color="C3", ms=5,
        label="this notebook's run: valid windows")
for (name, bits), style in zip(baselines.items(), (":", "--", "-."), strict=True):
    ax.axhline(bits, color="grey", ls=style, lw=1)
    ax.text(steps[-1], bits + 0.04, name, ha="right", va="bottom", fontsize=9, color="dimgrey")
ax.set_xscale("symlog", linthresh=10)  # linear up to step 10, logarithmic after
ax.set(xlim=(0, steps[-1]), xlabel="step (log scale after 10)", ylabel="bits per character", ylim=(1.5, 6.5),
       title="Training the course's GPT: train and validation bits per character")
ax.legend(loc="lower left")
plt.show()

crossing = {}
for name, bits in baselines.items():
    crossing[name] = next(e["step"] for e in full["log"] if e["valid_bits"] < bits)
    print(f"valid windows drop below the {name} at step {crossing[name]}")
last = full["log"][-1]
print(f"after {last['step']} steps: train windows {last['train_bits']:.2f}, valid windows {last['valid_bits']:.2f} "
      f"(a gap of {last['valid_bits'] - last['train_bits']:.2f} bits)")
assert crossing["unigram"] <= crossing["bigram"] <= crossing[f"trigram (k = {k3})"] < last["step"]
assert last["valid_bits"] < trigram - 0.5
""")

md(r"""
The curves fall fast at first, as the model learns which characters are common, then which pairs
follow each other. The first few hundred steps pass the unigram and the bigram; the trigram takes
longer. The log's last figures are on a sample of windows; the shipped model's score on the whole
split comes next.
""")

md(r"""
## 6. The course's trained model, on the whole `valid` split

`load_course_gpt` checks the file's sha256 before it reads the weights. We score it, and the
model we just trained, on every character of `valid`.
""")

code(r"""
gpt, gpt_vocab = load_course_gpt(device)
assert gpt_vocab.itos == vocab.itos
course_valid = bits_per_char(gpt, valid_ids.to(device))
live_valid = bits_per_char(live, valid_ids.to(device))
print(f"course model: {course_valid:.2f} bits per character on the whole valid split")
print(f"our {LIVE_STEPS}-step model: {live_valid:.2f}")
assert course_valid < trigram - 0.5 < live_valid
""", IGNORE)

md(r"""
## 7. Sampling: four ways to pick the next character

The model gives a probability for every character. How we pick one from them changes the text.

- **Greedy**: always the most probable character (`top_k=1`).
- **Temperature** $T$: divide the logits by $T$ before the softmax. $T < 1$ sharpens the
  distribution, $T > 1$ flattens it.
- **Top-k**: keep only the $k$ most probable characters, then draw.
- **Top-p** (nucleus, Holtzman et al. 2020): keep the most probable characters until their total
  probability reaches $p$, then draw.

`filter_logits` applies them in that order and sets the removed logits to $-\infty$.
Here is what each keeps after the prompt `"ROMEO:\nWhat "`.
""")

code(r"""
prompt = torch.tensor([vocab.encode("ROMEO:\nWhat ")], device=device)  # (1, T)
with torch.no_grad():
    next_logits = gpt(prompt)[0, -1].double().cpu()  # (V,)
settings = {"greedy": dict(top_k=1), "temperature 0.7": dict(temperature=0.7),
            "top-k, k=5": dict(top_k=5), "top-p, p=0.8": dict(top_p=0.8)}
before = torch.softmax(next_logits, dim=-1).topk(8)  # the 8 most probable, unfiltered
labels = [repr(vocab.itos[i])[1:-1] for i in before.indices.tolist()]
fig, axes = plt.subplots(1, 4, figsize=(13, 3), sharey=True)
for ax, (name, knobs) in zip(axes, settings.items(), strict=True):
    probs = torch.softmax(filter_logits(next_logits, **knobs), dim=-1)  # (V,)
    ax.bar(range(8), before.values, color="lightgrey", label="model")
    ax.bar(range(8), probs[before.indices], width=0.5, color="C0", label="after filtering")
    ax.set_xticks(range(8), labels)
    ax.set(title=f"{name}: {int((probs > 0).sum())} kept", xlabel="next character")
axes[0].set_ylabel("probability")
axes[0].legend()
plt.show()
kept = {name: int((torch.softmax(filter_logits(next_logits, **k), -1) > 0).sum()) for name, k in settings.items()}
assert kept["greedy"] == 1 and kept["top-k, k=5"] == 5 and kept["temperature 0.7"] == V
""")

md(r"""
A sampler of our own: filter, softmax, and one draw from a `torch.Generator` per step. The three
special tokens (`<pad>`, `<s>`, `</s>`) never occur in the text, so they are never drawn. Given
the same generator, our sampler must produce the same characters as `GPT.generate`.
""")

code(r"""
def my_generate(model, ids, max_new_tokens, generator, **knobs):
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(ids[:, -model.config.max_len:])[:, -1]  # (B, V): the last max_len tokens at most
        logits[:, [vocab.pad_id, vocab.bos_id, vocab.eos_id]] = float("-inf")  # never sampled
        probs = torch.softmax(filter_logits(logits, **knobs).float(), dim=-1)  # (B, V)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], dim=1)  # (B, t + 1)
    return ids


mine = my_generate(gpt, prompt, 40, torch.Generator(device).manual_seed(1), top_p=0.8)
theirs = gpt.generate(prompt, 40, top_p=0.8, generator=torch.Generator(device).manual_seed(1), use_cache=False)
assert torch.equal(mine, theirs)
print("my sampler equals GPT.generate given the same generator:", torch.equal(mine, theirs))
""")

md(r"""
Now a sample from each, and two measurements. **Repetition**: the share of distinct 4-character
strings among all 4-character strings of the samples (1.0 = nothing repeats). **Likelihood**: how
often the filter removes the character that really comes next in `valid` text. A removed
character gets probability zero, so the text would be impossible under that sampler.
""")

code(r"""
def distinct_4grams(text):
    grams = [text[i:i + 4] for i in range(len(text) - 3)]
    return len(set(grams)) / len(grams)


windows = valid_ids[:32 * 64].view(32, 64).to(device)  # (32, 64) windows of valid text
with torch.no_grad():
    held_logits = gpt(windows[:, :-1])  # (32, 63, V)
report = {}
for name, knobs in settings.items():
    gen = torch.Generator(device).manual_seed(0)
    out = gpt.generate(prompt.repeat(4, 1), 100, generator=gen, **knobs)  # (4, 112)
    samples = [vocab.decode(row[prompt.shape[1]:]) for row in out]
    removed = torch.isinf(filter_logits(held_logits, **knobs)).gather(-1, windows[:, 1:, None]).float().mean().item()
    report[name] = (distinct_4grams("".join(samples)), removed, samples[0])
""")

code(r"""
for name, (distinct, removed, sample) in report.items():
    print(f"--- {name}: distinct 4-grams {distinct:.2f}, true next character removed {removed:.0%}")
    print("ROMEO:\nWhat " + sample)
assert report["greedy"][0] < report["top-p, p=0.8"][0]
assert report["greedy"][1] > 0.25 and report["temperature 0.7"][1] == 0.0
assert 0 < report["top-k, k=5"][1] < report["greedy"][1] and 0 < report["top-p, p=0.8"][1] < report["greedy"][1]
""", IGNORE)

md(r"""
Greedy text repeats itself most, and it removes the true next character at more than a quarter of
the positions: it is confident and often wrong. Temperature alone never removes a character.
Top-k and top-p sit in between: they cut the unlikely tail, and with it some real text.

## 8. Writing past the context

The position table has `max_len` = 128 rows, so the model can read at most 128 characters. To
write more, `generate` keeps only the last 128 tokens as the context of each step (the rule of
nanoGPT): the model forgets what lies further back, but the text can go on as long as we like.
""")

code(r"""
long = gpt.generate(torch.tensor([vocab.encode("HAMLET:\n")], device=device), 600, temperature=0.8,
                    generator=torch.Generator(device).manual_seed(3))
text = vocab.decode(long[0])
print(text)
assert len(text) == len("HAMLET:\n") + 600 > 4 * config.max_len
assert text.count(":\n") >= 3  # several speeches, each opened by a speaker's name
""", IGNORE)

md(r"""
## 9. Generation with the KV cache

Without a cache, each new character reruns the model on the whole context. With one, each block
keeps the keys and values of earlier positions (lesson 09), and a step runs only the newest token.
`GPT.generate(use_cache=True)` uses `MultiHeadAttention`'s own cache, one per block.

Cropping has a cost here. The positions are learned and absolute: once the window slides by one
character, every token in it sits at a new position, so every cached key and value is stale. Past
`max_len` the cache must be rebuilt from the whole window at every step, and it saves nothing.
We count the work as the number of token positions the blocks compute, with a forward hook.
""")

code(r"""
def positions_computed(model, run):
    counts = []
    hook = model.blocks[0].register_forward_pre_hook(lambda module, args: counts.append(args[0].shape[1]))
    try:
        out = run()
    finally:
        hook.remove()
    return out, sum(counts), len(counts)


start_ids = torch.tensor([vocab.encode("KING LEAR:\n")], device=device)  # 11 tokens
work = {}
for new in (100, 400):  # inside the context (11 + 100 <= 128), and far past it
    for use_cache in (True, False):
        run = partial(gpt.generate, start_ids, new, top_k=1, use_cache=use_cache)
        out, positions, calls = positions_computed(gpt, run)
        work[new, use_cache] = (out, positions, calls)
        print(f"{new} new tokens, cache {'on ' if use_cache else 'off'}: {calls} forward calls, "
              f"{positions:,} positions computed")
for new in (100, 400):
    assert torch.equal(work[new, True][0], work[new, False][0])  # the same greedy tokens, cache or not
assert work[100, False][1] > 10 * work[100, True][1]  # inside the context: the cache saves most of the work
assert work[400, True][1] > 0.7 * work[400, False][1]  # past it: little is left to save
print("identical greedy tokens with and without the cache, inside and past max_len: True")
""")

md(r"""
Inside the context the cache computes one position per step instead of the whole prefix. Past it,
both compute about a full window per step. Models that generate long texts therefore use
*relative* positions, such as the rotary embeddings of lesson 06: a cached key keeps its meaning
when the window slides. How much faster is the cache inside the context on this machine? The
figure below varies from run to run and from machine to machine; the count above does not.
""")

code(r"""
def best_time(fn, repeats=3):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


t_cache = best_time(lambda: gpt.generate(start_ids, 100, top_k=1, use_cache=True))
t_full = best_time(lambda: gpt.generate(start_ids, 100, top_k=1, use_cache=False))
print(f"100 new tokens: {t_full * 1000:.0f} ms without the cache, {t_cache * 1000:.0f} ms with it "
      f"(about {t_full / t_cache:.1f}x faster here, on {device.type})")
""", IGNORE)

md(r"""
**What the cache costs.** Each block stores K and V: $2 \times B \times H_{kv} \times L \times D$
numbers. *Grouped-query attention* (lesson 04) lets several query heads share one key/value head,
so $H_{kv} < H$; *multi-query attention* keeps one ($H_{kv} = 1$). The formula and the caches that
`new_caches` really allocates agree.
""")

code(r"""
for n_kv in (4, 2, 1):
    cfg = GPTConfig.course(V, n_kv_heads=n_kv)
    caches = GPT(cfg).new_caches(1, cfg.max_len)
    measured = sum(c.k.nbytes + c.v.nbytes for c in caches)
    formula = cfg.n_layers * 2 * 1 * n_kv * cfg.max_len * cfg.head_dim * 4  # float32: 4 bytes
    assert measured == formula
    print(f"{ {4: 'MHA', 2: 'GQA', 1: 'MQA'}[n_kv]}: {n_kv} key/value heads, {cfg.max_len} positions: "
          f"{measured / 1024:.0f} KiB")
""")

md(r"""
## 10. The test split, once

Every choice is made: the recipe, the trigram's $k$, the sampling settings. Only now do we score
the `test` split, for every model, once.
""")

code(r"""
test_ids = torch.tensor(vocab.encode(load_text("test")))
final = {"unigram": ngram_bits_per_char(train_ids, test_ids, V, 1),
         "bigram": ngram_bits_per_char(train_ids, test_ids, V, 2),
         f"trigram (k = {k3})": ngram_bits_per_char(train_ids, test_ids, V, 3, k=k3),
         f"our {LIVE_STEPS}-step GPT": bits_per_char(live, test_ids.to(device)),
         "course GPT": bits_per_char(gpt, test_ids.to(device))}
for name, bits in final.items():
    print(f"{name:20} {bits:.2f} bits per character on the whole test split")
values = list(final.values())
assert values[0] > values[1] > values[2] and values[3] > values[2] > values[4]
assert final["course GPT"] < values[2] - 0.5
""", IGNORE)

md(r"""
On `test`, each baseline beats the one before it, the course model beats the trigram by well over
half a bit per character, and the few live steps have not yet caught up with the trigram.

## Summary

- A GPT is the decoder of lesson 08 without the cross-attention: embeddings, causal Pre-LN blocks,
  a final norm, and an output layer tied to the embedding. It equals PyTorch's own modules.
- Training curves in bits per character pass the unigram and bigram within a few hundred steps;
  the trigram takes longer; the full run ends far below all three.
- Honest scores: each figure is over a whole named split; the `valid` split chooses, the `test`
  split is scored once. On it: unigram > bigram > trigram > the course model.
- Greedy decoding repeats itself; temperature, top-k and top-p trade variety against the risk of
  cutting the true next character. Cropping the context lets generation run past `max_len`.
- The KV cache gives the same tokens for much less work inside the context; with learned
  positions it must be rebuilt once the window slides.

## Exercises

Fill in each function (or number) in the cell below its question, then run the cell: the check
under it prints one line, ✓ when your answer is right, or what is wrong. Worked solutions are in
`solutions/12_gpt_from_scratch_solutions.ipynb`.

**1. Top-p filtering.** Write `top_p_filter(logits, top_p)`: keep the most probable tokens while the
tokens ranked before each one sum to less than `top_p`, set the rest to `-inf`.
""")

code(r"""
def top_p_filter(logits, top_p):
    # your code here
    return None


check_top_p_filter(top_p_filter)
""")

md(r"""
**2. Temperature sampling with a generator.** Write `temperature_sample(logits, temperature,
generator)`: one `torch.multinomial` draw per row from the softmax of `logits / temperature`,
returning ids of shape (B, 1).
""")

code(r"""
def temperature_sample(logits, temperature, generator):
    # your code here
    return None


check_temperature_sample(temperature_sample)
""")

md(r"""
**3. Bits per character of a string.** Write `bits_per_char_of(model, vocab, text)`: the mean of
$-\log_2 p$ of characters 1, 2, ... of `text`, each predicted from the characters before it.
""")

code(r"""
def bits_per_char_of(model, vocab, text):
    # your code here
    return None


check_bits_per_char(bits_per_char_of)
""")

md(r"""
**4. One cached step.** Write `cached_step(model, caches, token)`: run one new token (B, 1) through
the model, reading and extending `caches` (one per block, already holding the prompt), and return
the next-token logits (B, V). Use `model.embed`, `model.pos`, each `block(x, None, False, cache)`,
`model.norm` and `model.head`.
""")

code(r"""
def cached_step(model, caches, token):
    # your code here
    return None


check_cached_step(cached_step)
""")

md(r"""
**5. Predict, then run.** A larger GPT: C = 256, 8 query heads but `n_kv_heads=2` (grouped-query
attention), 6 blocks, context 256, float32. How many bytes do its KV caches take for a batch of 4
sequences, each of full length? Write your number first.
""")

code(r"""
predicted_bytes = None  # your prediction
check_predict_cache_bytes(predicted_bytes)
""")

md(r"""
## Going deeper: overfitting, dropout and weight decay

A model overfits when it can memorise its training text: it keeps getting better on that text
while new text stops improving or gets worse. We provoke it: a
slice of 3,000 characters, a smaller model, 200 steps, so each character is seen about 30 times.
Then we train the same model with two brakes. *Dropout* (Srivastava et al. 2014) zeroes a random
20% of the activations at every step, so no unit can rely on another. *Weight decay* pulls every
weight a little towards zero at every step (AdamW's `weight_decay`, Loshchilov & Hutter 2019).
""", collapsed=True)

code(r"""
slice_ids = train_ids[:3_000]


def fit_slice(dropout, weight_decay, steps=200):
    torch.manual_seed(0)
    m = GPT(GPTConfig(V, d_model=64, n_heads=4, n_layers=2, d_ff=256, max_len=32, dropout=dropout)).to(device)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, betas=(0.9, 0.99), weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_factor(s, steps, 20))
    train_lm(m, opt, sched, slice_ids, steps, 16, torch.Generator().manual_seed(0), desc=f"dropout {dropout}",
             progress=False)
    return bits_per_char(m, slice_ids.to(device)), bits_per_char(m, valid_ids.to(device))


plain = fit_slice(0.0, 0.0)
braked = fit_slice(0.2, 0.1)
for name, (tr, va) in (("no dropout, no decay", plain), ("dropout 0.2, decay 0.1", braked)):
    print(f"{name:23} train slice {tr:.2f}, whole valid split {va:.2f}: gap {va - tr:.2f} bits")
assert plain[1] - plain[0] > 1.0  # memorised: far better on its own slice than on new text
assert braked[1] - braked[0] < plain[1] - plain[0] - 0.2  # the brakes close part of the gap
assert abs(braked[1] - plain[1]) < 0.15  # on new text, both about as good (or bad)
assert last["valid_bits"] - last["train_bits"] < 0.5 * (plain[1] - plain[0])  # the full run's gap is far smaller
quarter = full["log"][3 * len(full["log"]) // 4]  # the log entry three quarters of the way
assert quarter["train_bits"] - last["train_bits"] > 0.05 and abs(quarter["valid_bits"] - last["valid_bits"]) < 0.03
""", IGNORE)

md(r"""
The brakes close a good part of the gap: the model memorises less of its slice. They do not make
it much better on new text, because 3,000 characters hold too little of English to learn from.
Regularisation trades memorising for generalising; only more data, as the course model had, buys
both. The full run above used weight decay 0.1 and no dropout. Its gap, printed under its curves,
is a fraction of this one, but in its last quarter its train curve kept falling while its valid
curve stayed flat: it, too, had begun to memorise. We tried dropout 0.1 on it within the same
30-minute budget: each step took about 1.5 times as long, so it made 4,300 steps instead of 6,400,
and it ended slightly worse on the whole `valid` split (about 2.27 bits against 2.24;
`data/train_gpt.py` records the trial). Here the brake cost more time than it saved.
""")

md(r"""
## Going deeper: training on several GPUs or machines

`data/train_gpt.py` also runs as several processes, each with a copy of the model, through PyTorch's
`DistributedDataParallel` (DDP):

```bash
torchrun --nproc_per_node=4 data/train_gpt.py            # 4 processes on this machine (one per GPU)
torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 \
         --rdzv_endpoint=HOST:29500 data/train_gpt.py    # and the same with --node_rank=1 on the second machine
```

What changes, and what does not:

- each process draws the same global batch of 32 windows from the same seed and keeps its share
  (8 of them with 4 processes), so the run follows the same recipe as one process;
- after `backward`, DDP averages the gradients of all processes (an *all-reduce*, over NCCL between
  GPUs, gloo between CPUs), so every copy takes the same optimiser step and the copies stay equal;
- the work per process shrinks with the number of processes, the communication grows with the
  number of parameters; a small model like ours spends most of its time talking.

The whole trick rests on one identity: the mean of the processes' mean gradients, on equal shares,
is the gradient of the whole batch. We check it with two shares.
""", collapsed=True)

code(r"""
torch.manual_seed(0)
small = GPT(GPTConfig.tiny(V, max_len=32)).to(device)
x, y = spaced_windows(train_ids, 32, 8)  # one global batch of 8 windows


def gradient(xb, yb):
    small.zero_grad()
    F.cross_entropy(small(xb.to(device)).flatten(0, 1), yb.to(device).flatten()).backward()
    return torch.cat([p.grad.flatten() for p in small.parameters()])


whole = gradient(x, y)
shares = [gradient(x[i:i + 4], y[i:i + 4]) for i in (0, 4)]  # two processes, 4 windows each
averaged = (shares[0] + shares[1]) / 2  # what DDP's all-reduce computes
assert torch.allclose(averaged, whole, atol=1e-6)
print("mean of the two shares' gradients = gradient of the whole batch:", torch.allclose(averaged, whole, atol=1e-6))
""")

md(r"""
`tests/test_train_gpt.py` goes further: it trains for a few steps as two real processes and as one,
and finds the same weights to within float rounding.
""")

md(r"""
## Going deeper: byte-pair encoding

Characters make long sequences. *Byte-pair encoding* (Sennrich et al. 2016) starts from characters
and repeatedly merges the most frequent adjacent pair into a new token. We learn 100 merges on the
first 60,000 training characters and measure how much shorter the `valid` text becomes.
""", collapsed=True)

code(r"""
from collections import Counter


def learn_bpe(ids, n_merges, first_new_id):
    ids, merges = list(ids), []
    for new in range(first_new_id, first_new_id + n_merges):
        pair = Counter(zip(ids[:-1], ids[1:], strict=True)).most_common(1)[0][0]
        merges.append((pair, new))
        ids = apply_merge(ids, pair, new)
    return merges


def apply_merge(ids, pair, new):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


merges = learn_bpe(train_ids[:60_000].tolist(), 100, V)
pieces = {i: vocab.itos[i] for i in range(V)}
for (a, b), new in merges:
    pieces[new] = pieces[a] + pieces[b]
print("first merges:", [pieces[new] for _, new in merges[:12]])
encoded = valid_ids.tolist()
for pair, new in merges:
    encoded = apply_merge(encoded, pair, new)
ratio = len(valid_ids) / len(encoded)
print(f"valid text: {len(valid_ids):,} characters -> {len(encoded):,} tokens ({ratio:.2f} characters per token)")
assert ratio > 1.4
""")

md(r"""
## Going deeper: a first look at the heads

The trained model's attention weights on a line of `valid` text, one panel per head of the first
block, on one shared colour scale.
""", collapsed=True)

code(r"""
sentence = "BRUTUS:\nLucius, awake!\n"
s_ids = torch.tensor([vocab.encode(sentence)], device=device)
with torch.no_grad():
    gpt(s_ids, need_weights=True)
first_block = gpt.blocks[0].attn_weights[0].cpu()  # (H, T, T)
labels = [repr(c)[1:-1] for c in sentence]
fig = heads_grid(first_block.numpy(), labels, labels, ncols=2, title="block 1: one panel per head")
plt.show()
assert torch.allclose(first_block.sum(-1), torch.ones(first_block.shape[:2]), atol=1e-5)
""")

md(r"""
A **previous-token head** puts most of its weight on the position just before the query. We
measure, for every head, its average weight on position $t - 1$ over windows of `valid` text.
""")

code(r"""
with torch.no_grad():
    gpt(windows[:8], need_weights=True)
prev = torch.stack([block.attn_weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))
                    for block in gpt.blocks])  # (n_layers, H)
layer, head = divmod(int(prev.argmax()), prev.shape[1])
print(f"strongest previous-token head: block {layer + 1}, head {head + 1}, weight on t-1 about {prev.max():.1f}")
assert prev.max() > 0.4
""", IGNORE)

md(r"""
**Copying.** An *induction head* finds an earlier occurrence of the current token and predicts the
token that followed it, so a model that has them predicts a repeated passage better the second time.
We feed a 60-character passage of `valid` text twice.
""")

code(r"""
passage = valid_text[1_000:1_060]
twice = torch.tensor([vocab.encode(passage + passage)], device=device)  # (1, 120)
with torch.no_grad():
    nll = F.cross_entropy(gpt(twice[:, :-1])[0], twice[0, 1:], reduction="none") / math.log(2)  # (119,)
first, second = nll[:59].mean().item(), nll[60:].mean().item()
print(f"bits per character: first copy about {first:.1f}, second copy about {second:.1f}")
assert second > 0.7 * first  # no large drop: the model does not copy the first occurrence
""", IGNORE)

md(r"""
The second copy costs about as much as the first: this model does not copy. That is not a matter
of size. Olsson et al. (2022) found induction heads in attention-only models of just two layers;
what they need is training on text where copying pays, for long enough. Lesson 13 trains such
models and watches the induction heads form.
""")


def main():
    import json

    path = Path(__file__).parent / "12_gpt_from_scratch.ipynb"  # where the lesson lives (the badge names it)
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else path
    nb = {"cells": CELLS, "metadata": json.loads(path.read_text())["metadata"], "nbformat": 4,
          "nbformat_minor": 5}
    nbtools.write(nbtools.render_one(nb, path), out)
    words = 0
    folded = False
    for cell in CELLS:
        if cell["cell_type"] != "markdown":
            continue
        if cell["source"].startswith("## "):
            folded = cell["source"].startswith("## Going deeper")
        if not folded:
            words += len(cell["source"].split())
    print("main-path words:", words)


if __name__ == "__main__":
    main()
