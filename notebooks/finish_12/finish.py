"""Finish issue 30 once data/train_gpt.py has written the checkpoint and its log (run from the worktree root).

1. data/README.md: the checkpoint section rewritten from the log (figures measured, sha rows);
2. the tests that need the new checkpoint (tests/test_lm.py, tests/test_gitattributes.py);
3. lesson 12 built from notebooks/build_12.py, executed, and checked with strict nbval on both numeric paths.
Each step prints what it did; nothing is committed (see FINISH.md for the commit).
"""
import hashlib
import json
import sys
from pathlib import Path

import torch

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))
from helpers.data import Vocab, load_text  # noqa: E402
from helpers.lm import LOG_FILE, best_k, ngram_bits_per_char  # noqa: E402

data = ROOT / "data"
ckpt, log_path = data / "gpt_shakespeare.pt", data / LOG_FILE
assert log_path.is_file() and not (data / "gpt_shakespeare.pt.resume").exists(), "training has not finished"
log = json.loads(log_path.read_text())
sha = hashlib.sha256(ckpt.read_bytes()).hexdigest()
assert log["checkpoint_sha256"] == sha, "the log belongs to another checkpoint"
log_sha = hashlib.sha256(log_path.read_bytes()).hexdigest()
r, fin = log["recipe"], log["final"]

tr = load_text("train")
vocab = Vocab(tr)
V = len(vocab)
ids = {s: torch.tensor(vocab.encode(load_text(s))) for s in ("train", "valid", "test")}
k3, tri_valid = best_k(ids["train"], ids["valid"], V, 3, (0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 1.0))
base = {name: {s: ngram_bits_per_char(ids["train"], ids[s], V, n, k) for s in ("valid", "test")}
        for name, n, k in (("unigram", 1, 1.0), ("bigram", 2, 1.0), ("trigram", 3, k3))}
minutes = log["train_seconds"] / 60
U, Bi, Tri = base["unigram"], base["bigram"], base["trigram"]
section = f"""## The course's trained GPT and its training log (lesson 12)

`helpers.gpt.load_course_gpt()` loads this checkpoint after checking its sha256: a
`GPTConfig.course(70)` model (C 128, 4 heads, 4 Pre-LN blocks, d_ff 512, context 128, output
tied to the embedding) trained on the `train` part of `shakespeare.txt`, with its character
vocabulary (`helpers.data.Vocab` of the training text: 67 characters after `<pad>`, `<s>`, `</s>`).
`helpers.lm.load_training_log()` reads its training log, also after checking its sha256.

| file | parameters or log entries | bytes | sha256 |
| --- | --- | --- | --- |
| `gpt_shakespeare.pt` | {log['parameters']} | {ckpt.stat().st_size} | `{sha}` |
| `{LOG_FILE}` | {len(log['log'])} | {log_path.stat().st_size} | `{log_sha}` |

**Format.** The checkpoint is a `torch.save` dictionary readable with `weights_only=True`: `config`
(the `GPTConfig` fields), `state_dict` (float32 tensors) and `symbols` (the vocabulary's characters).
The log is JSON: `recipe` (every option of `data/train_gpt.py` the run used), `config`, `parameters`,
the processes, threads, device and torch version, `train_seconds`, `log` (one entry every
{r['log_every']} steps: the step, the seconds so far, `train_bits` and `valid_bits` on {r['log_windows']}
fixed windows of 128 characters spread evenly over each split (`helpers.lm.spaced_windows`), and
`train_loss_bits`, the mean training loss of the steps since the entry before), `final` (bits per
character on the whole `valid` split and, scored once, on the whole `test` split) and the
checkpoint's sha256.

**How it was made.** `make train-gpt` runs `data/train_gpt.py`, the one home of the recipe: seed
{r['seed']} for the initial weights and for every batch; {r['steps']:,} AdamW steps (learning rate {r['lr']:g}
with {r['warmup']} warm-up steps, then cosine decay to {r['lr'] * r['lr_floor']:g}; betas (0.9, {r['beta2']}); weight
decay {r['weight_decay']}; gradients clipped to norm {r['clip']:g}) of {r['batch_size']} random windows of
{r['max_len']} characters, dropout {r['dropout']}; {log['processes']} process with {log['threads_per_process']} CPU
threads. The run took {log['train_seconds']:,.0f} s ({minutes:.1f} minutes) of training on the course's 2-core machine (an AMD EPYC virtual
machine) with no other heavy job running. A run that is stopped goes on from its last log entry, bit
for bit: `make train-gpt TRAIN_ARGS=--resume`. The sha256 above holds for this torch build
({log['torch']}) and 2 threads; another build, CPU or thread count rounds differently and ends with
other weights.

| bits per character | unigram | bigram | trigram (k = {k3}) | this model |
| --- | --- | --- | --- | --- |
| whole `valid` split | {U['valid']:.3f} | {Bi['valid']:.3f} | {Tri['valid']:.3f} | {fin['valid_bits']:.3f} |
| whole `test` split | {U['test']:.3f} | {Bi['test']:.3f} | {Tri['test']:.3f} | {fin['test_bits']:.3f} |

The counting baselines use add-k smoothing of the training text's counts: k = 1 for the unigram
and the bigram, and for the trigram the k of 0.01, 0.03, 0.1, 0.2, 0.3, 0.5 and 1 that scores best
on `valid` (`helpers.lm.best_k`).

**Licence.** Weights trained by the course's own code on the public-domain text above; covered
by the licence of the course repository.
"""
readme = (data / "README.md").read_text()
start = readme.index("## The course's trained GPT")
readme = readme[:start] + section
(data / "README.md").write_text(readme)
print("README: section rewritten;", f"valid {fin['valid_bits']:.4f}, test {fin['test_bits']:.4f}, trigram k {k3}")

tests = ROOT / "tests" / "test_lm.py"
if "test_the_course_checkpoint_beats_the_trigram" not in tests.read_text():
    tests.write_text(tests.read_text() + (Path(__file__).parent / "tests_lm_append.txt").read_text())
    print("tests/test_lm.py: the checkpoint's test-split test added")
exec((Path(__file__).parent / "gitattr_patch.py").read_text())
