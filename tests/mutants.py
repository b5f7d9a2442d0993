"""Planted bugs the tests must catch: ``make mutants`` (python tests/mutants.py [-k NAME]).

Each mutant replaces one exact piece of helpers/ code with a wrong one, in a temporary copy of the
project, runs the tests that should notice (a fast subset, stopping at the first failure) and is
"killed" when they fail. The survivors are printed: each is a bug the tests would let through.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # under helpers/
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple  # pytest arguments: files, with -k filters where a whole file is slow


DEC = ("tests/test_decoding.py",)
GPT_GEN = ("tests/test_decoding.py", "tests/test_gpt.py", "-k",
           "generate or lively or special or top_k or filter or cached_logits")
KV = ("tests/test_kv_cache.py", "tests/test_attention.py", "-k", "cache")
TF = ("tests/test_transformer.py", "tests/test_layers.py")
FLASH = ("tests/test_flash.py",)
MASKS = ("tests/test_masks.py",)
POS = ("tests/test_positional.py",)
PRE = ("tests/test_pretrained.py", "-k", "not float64")
RNN = ("tests/test_rnn.py", "tests/test_decoding.py", "-k", "rnn")

MUTANTS = [
    # decoding bookkeeping
    Mutant("beam lengths not reordered with their beams", "decoding.py",
           "lengths = lengths[rows] + (~done[rows]).long()", "lengths = lengths + (~done[rows]).long()", DEC),
    Mutant("beam done flags not reordered", "decoding.py",
           "done = done[rows] | (token == eos_id)", "done = done | (token == eos_id)", DEC),
    Mutant("beam rows from the wrong source", "decoding.py",
           "rows = (rows_of + flat // V).flatten()", "rows = (flat // V).flatten()", DEC),
    Mutant("finished beams pay for their pad", "decoding.py",
           "pad_only[pad_id] = 0.0", "pad_only[pad_id] = -1.0", DEC),
    Mutant("beam ignores the length penalty", "decoding.py",
           "normalised = scores / _length_penalty(lengths.view(B, k).double(), alpha)", "normalised = scores", DEC),
    Mutant("all beams start live", "decoding.py",
           "scores[:, 0] = 0.0  # one live beam", "scores[:, :] = 0.0  # one live beam", DEC),
    Mutant("greedy keeps writing after eos", "decoding.py",
           "next_id = next_id.masked_fill(done, model.config.pad_id)  # finished rows get pad",
           "next_id = next_id  # finished rows get pad", DEC),
    Mutant("cached greedy cuts one token short", "decoding.py",
           "L = 1 + int(torch.where(finished, first_eos + 1,", "L = int(torch.where(finished, first_eos + 1,", DEC),
    Mutant("RNN greedy pads its first </s> too", "decoding.py",
           "ids = ids.masked_fill(is_eos.cumsum(dim=1) - is_eos > 0, model.pad_id)",
           "ids = ids.masked_fill(is_eos.cumsum(dim=1) > 0, model.pad_id)", RNN),
    Mutant("RNN greedy feeds <s> at every step", "decoding.py",
           "token = model.decode_step(token, cache).argmax(dim=-1)  # (B, 1, V) -> (B, 1)\n        ids.append(token)",
           "ids.append(model.decode_step(token, cache).argmax(dim=-1))", RNN),
    Mutant("RNN step forgets its state", "rnn.py",
           "logits, cache.memory, weights = self.decoder(ids, cache.memory)",
           "logits, _, weights = self.decoder(ids, cache.memory)", RNN),
    Mutant("generate skips refreshing the logits on its last step", "decoding.py",
           "            else:\n                logits = model.decode_step(out[:, -1:], caches)[:, -1]",
           "            elif out.shape[1] < ids.shape[1] + max_new_tokens - 1:\n"
           "                logits = model.decode_step(out[:, -1:], caches)[:, -1]", GPT_GEN),
    Mutant("generate feeds the previous token to the cache", "decoding.py",
           "logits = model.decode_step(out[:, -1:], caches)[:, -1]",
           "logits = model.decode_step(out[:, -2:-1], caches)[:, -1]", GPT_GEN),
    Mutant("generate crops nothing", "decoding.py",
           "context = out[:, -cfg.max_len:]", "context = out", GPT_GEN),
    Mutant("generate samples the special ids", "decoding.py",
           'logits[:, special] = float("-inf")  # never sampled', "pass  # never sampled", GPT_GEN),
    # sampling filters
    Mutant("top-k keeps one too many", "decoding.py",
           "top_k = min(positive_int(top_k, \"top_k\"), x.shape[-1])",
           "top_k = min(positive_int(top_k, \"top_k\") + 1, x.shape[-1])", GPT_GEN),
    Mutant("top-p drops the token that crosses p", "decoding.py",
           "before = sorted_probs.cumsum(dim=-1) - sorted_probs", "before = sorted_probs.cumsum(dim=-1)", GPT_GEN),
    Mutant("temperature multiplies", "decoding.py",
           "x = logits.to(torch.promote_types(logits.dtype, torch.float32)) / t",
           "x = logits.to(torch.promote_types(logits.dtype, torch.float32)) * t", GPT_GEN),
    # KV-cache positions
    Mutant("KV cache writes every step to slot 0", "attention.py",
           "self.k[:, :, self.length:self.length + T_new] = k_new",
           "self.k[:, :, 0:T_new] = k_new", KV),
    Mutant("KV cache forgets to count", "attention.py", "        self.length += T_new\n", "\n", KV),
    Mutant("GPT cached step restarts the positions", "gpt.py",
           "x = self.dropout(self.pos(self.embed(ids), offset=past))", "x = self.dropout(self.pos(self.embed(ids)))",
           GPT_GEN),
    Mutant("decoder cached step restarts the positions", "transformer.py",
           "offset = 0 if cache is None or cache.self_attn is None else cache.self_attn[0].start()",
           "offset = 0", KV + ("tests/test_decoding.py",)),
    Mutant("cached causal mask lets a query read its future", "masks.py",
           "return torch.arange(S, device=device)[None, :] <= rows[:, None]",
           "return torch.arange(S, device=device)[None, :] <= rows[:, None] + 1", KV + ("tests/test_masks.py",)),
    # residual placement
    Mutant("Pre-LN residual adds the normalised input", "layers.py",
           "return x + self.dropout(sublayer(norm(x)))", "return norm(x) + self.dropout(sublayer(norm(x)))", TF),
    Mutant("Post-LN residual normalises before the sum", "layers.py",
           "return norm(x + self.dropout(sublayer(x)))", "return x + self.dropout(sublayer(norm(x)))", TF),
    Mutant("GPT block skips its second norm", "gpt.py",
           "return x + self.dropout(self.ff(self.norm2(x)))", "return x + self.dropout(self.ff(x))",
           ("tests/test_gpt.py", "-k", "torch or reference")),
    Mutant("GPT block drops the attention residual", "gpt.py",
           "x = x + self.dropout(self.self_attend(", "x = self.dropout(self.self_attend(",
           ("tests/test_gpt.py", "-k", "torch or reference")),
    # masks
    Mutant("causal mask above the diagonal", "masks.py",
           "return torch.ones(T, T, dtype=torch.bool, device=device).tril()",
           "return torch.ones(T, T, dtype=torch.bool, device=device).triu()", MASKS),
    Mutant("padding mask keeps the pads", "masks.py",
           "return (ids != pad_id)[:, None, None, :]", "return (ids >= 0)[:, None, None, :]", MASKS + TF),
    Mutant("sliding window one too wide", "masks.py",
           "return (distance >= 0) & (distance < window)  # (T, T)",
           "return (distance >= 0) & (distance <= window)  # (T, T)", MASKS),
    Mutant("attention ignores the mask", "attention.py",
           'scores = scores.masked_fill(~mask, float("-inf"))  # blocked pairs get exp(-inf) = 0',
           "pass  # blocked pairs get exp(-inf) = 0", ("tests/test_attention.py",)),
    # positions
    Mutant("sinusoidal encoding swaps sin and cos", "positional.py",
           "pe[:, 0::2] = torch.sin(angle)", "pe[:, 0::2] = torch.cos(angle)", POS),
    Mutant("learned positions ignore the offset", "positional.py",
           "positions = torch.arange(offset, offset + T, device=x.device)",
           "positions = torch.arange(0, T, device=x.device)", POS + ("tests/test_gpt.py",)),
    Mutant("sinusoidal table ignores the offset", "positional.py",
           "return self.dropout(x + self.pe[offset:offset + T].to(x.dtype))",
           "return self.dropout(x + self.pe[:T].to(x.dtype))", POS + KV),
    # flash forward and backward
    Mutant("flash forward forgets to rescale the running sum", "flash.py",
           "l_sum = rescale * l_sum + p.sum(dim=-1, keepdim=True)", "l_sum = l_sum + p.sum(dim=-1, keepdim=True)",
           FLASH),
    Mutant("flash forward forgets to rescale the accumulator", "flash.py",
           "acc = rescale * acc + p @ _tile(v, read, j0, j1, work)", "acc = acc + p @ _tile(v, read, j0, j1, work)",
           FLASH),
    Mutant("flash forward drops the scale", "flash.py",
           "q_i = q[:, :, i0:i1].to(work) * scale", "q_i = q[:, :, i0:i1].to(work)", FLASH),
    Mutant("flash backward forgets D_i", "flash.py",
           "ds = p * (dp - delta[:, :, i0:i1])", "ds = p * dp", FLASH),
    Mutant("flash backward dK unscaled", "flash.py",
           "dk_j += (ds.transpose(-2, -1) @ q_i) * scale", "dk_j += ds.transpose(-2, -1) @ q_i", FLASH),
    Mutant("flash backward dV from the wrong side", "flash.py",
           "dv_j += p.transpose(-2, -1) @ do_i", "dv_j += p.transpose(-2, -1) @ do_i * 0.5", FLASH),
    # pooling
    Mutant("mean pooling counts the padding", "pretrained.py",
           "mean = (hidden * w).sum(dim=1) / w.sum(dim=1).clamp(min=1e-9)",
           "mean = (hidden * w).sum(dim=1) / hidden.shape[1]", PRE),
    Mutant("sentence embeddings not normalised", "pretrained.py",
           "out[rows.to(device)] = F.normalize(mean, p=2, dim=1)", "out[rows.to(device)] = mean", PRE),
]


def copy_project(dest: Path) -> None:
    ignore = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.pyc", ".hypothesis", "my-notebooks",
                                    "site", "*.ipynb_checkpoints")
    for name in ("helpers", "tests", "benchmarks", "data", "pyproject.toml"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore, symlinks=True)
        elif src.exists():
            shutil.copy2(src, dest / name)


def run_mutant(m: Mutant, work: Path, python: str, timeout: int) -> str:
    target = work / "helpers" / m.file
    original = target.read_text()
    if original.count(m.old) != 1:
        return f"stale ({original.count(m.old)} matches)"
    target.write_text(original.replace(m.old, m.new))
    env = {**os.environ, "PYTHONPATH": str(work), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "COURSE_DEVICE": "cpu"}
    try:
        done = subprocess.run([python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               "--hypothesis-seed=0", *m.tests], cwd=work, env=env, capture_output=True,
                              text=True, timeout=timeout)
        return "killed" if done.returncode == 1 else f"survived (pytest exit {done.returncode})" \
            if done.returncode == 0 else f"error (pytest exit {done.returncode})"
    except subprocess.TimeoutExpired:
        return "killed (timeout)"
    finally:
        target.write_text(original)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="run only the mutants whose name contains this")
    parser.add_argument("--timeout", type=int, default=600)
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if args.k in m.name]
    python = sys.executable
    killed, survivors, broken = 0, [], []
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        work = Path(tmp)
        copy_project(work)
        for m in chosen:
            start = time.perf_counter()
            result = run_mutant(m, work, python, args.timeout)
            print(f"{result:28} {time.perf_counter() - start:6.1f} s  {m.file:16} {m.name}", flush=True)
            if result.startswith("killed"):
                killed += 1
            elif result.startswith("survived"):
                survivors.append(m)
            else:
                broken.append((m, result))
    print(f"\n{killed} of {len(chosen)} mutants killed")
    for m in survivors:
        print(f"SURVIVED: {m.name} ({m.file}: {m.old!r} -> {m.new!r})")
    for m, result in broken:
        print(f"NOT RUN: {m.name}: {result}")
    return 1 if survivors or broken else 0


if __name__ == "__main__":
    sys.exit(main())
