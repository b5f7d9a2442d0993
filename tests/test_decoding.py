"""helpers.decoding (lessons 01, 08, 09 and 12): beam search against exhaustive search and a plain reference,
greedy, cached greedy against uncached, host reads; the GPT's generation loop and its sampling filters; the RNN's
greedy loop against the loop written out, and its decode_step against teacher forcing."""

import itertools
import math
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.decoding import (
    _greedy_step,
    beam_search,
    filter_logits,
    greedy_decode,
    greedy_decode_cached,
    greedy_decode_rnn,
)
from helpers.gpt import GPT, GPTConfig, load_course_gpt
from helpers.rnn import AttentionDecoder, Decoder, Encoder, Seq2Seq
from helpers.transformer import Transformer, TransformerConfig

PAD, BOS, EOS = 0, 1, 2
DT = torch.float64


def tiny(seed, tgt_v, src_v=9, **overrides):
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig.tiny(src_v, tgt_v, **overrides)).to(DT).eval()
    with torch.no_grad():  # sharper next-token distributions than the initial ones: ranking matters more
        model.head.weight.mul_(4.0)
    return model


def source(seed, B, S, V=9, n_pad=0):
    src = torch.randint(3, V, (B, S), generator=torch.Generator().manual_seed(seed))  # (B, S)
    if n_pad:
        src[0, S - n_pad:] = PAD  # the first row is shorter: padded keys in the cross-attention
    return src


def penalty(n, alpha):
    return ((5.0 + n) / 6.0) ** alpha


@torch.no_grad()
def all_hypotheses(model, src, max_len, alpha):
    """Every output of at most max_len - 1 tokens after BOS, with its length-normalised score.

    Each sequence y of exactly max_len - 1 tokens is scored by teacher forcing (one batched
    forward); the hypothesis it stands for ends at its first eos (or at max_len - 1 tokens).
    Returns {hypothesis (tuple, BOS first): normalised score}.
    """
    V, n = model.config.tgt_vocab_size, max_len - 1
    ys = torch.tensor(list(itertools.product(range(V), repeat=n)))  # (N, n)
    tgt = torch.cat([torch.full((len(ys), 1), BOS), ys[:, :-1]], dim=1)  # (N, n): BOS + all but the last
    logits = model(src.expand(len(ys), -1), tgt)  # (N, n, V)
    token_lp = torch.log_softmax(logits.double(), -1).gather(-1, ys[..., None])[..., 0]  # (N, n)
    cum = token_lp.cumsum(dim=1)  # (N, n): log P of every prefix
    out = {}
    for row, lp in zip(ys.tolist(), cum.tolist(), strict=True):
        length = row.index(EOS) + 1 if EOS in row else n
        out[(BOS, *row[:length])] = lp[length - 1] / penalty(length, alpha)
    return out


def score_of(hypotheses, ids):
    """The score of a returned row (BOS first, pads after eos)."""
    row = ids.tolist()
    if EOS in row[1:]:
        row = row[:row.index(EOS, 1) + 1]
    return hypotheses[tuple(row)]


# --- beam search -----------------------------------------------------------------------------------

@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), tgt_v=st.integers(3, 5), max_len=st.integers(2, 4),
       alpha=st.sampled_from([0.0, 0.6, 2.0]), norm_first=st.booleans())
def test_beam_wider_than_the_search_space_finds_the_best_hypothesis(seed, tgt_v, max_len, alpha, norm_first):
    """Beam size V ** (max_len - 1) never prunes: beam search becomes exhaustive search."""
    model = tiny(seed, tgt_v, norm_first=norm_first)
    src = source(seed, 1, 4)
    hyps = all_hypotheses(model, src, max_len, alpha)
    best = max(hyps.values())
    out = beam_search(model, src, BOS, EOS, max_len, beam_size=tgt_v ** (max_len - 1), length_penalty=alpha)
    assert out.shape[0] == 1 and out[0, 0] == BOS
    assert score_of(hyps, out[0]) == pytest.approx(best, abs=1e-9)
    # so it is never worse than greedy, which is one of the hypotheses
    greedy = greedy_decode(model, src, BOS, EOS, max_len)
    assert score_of(hyps, out[0]) >= score_of(hyps, greedy[0]) - 1e-9


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), tgt_v=st.integers(3, 8), B=st.integers(1, 3), max_len=st.integers(2, 10),
       norm_first=st.booleans(), layers=st.integers(1, 2))
def test_beam_of_one_is_greedy(seed, tgt_v, B, max_len, norm_first, layers):
    # small vocabularies make rows emit eos (and pad) at different steps
    model = tiny(seed, tgt_v, norm_first=norm_first, n_encoder_layers=layers, n_decoder_layers=layers)
    src = source(seed, B, 5)
    src[0, 3:] = PAD
    assert torch.equal(beam_search(model, src, BOS, EOS, max_len, beam_size=1),
                       greedy_decode(model, src, BOS, EOS, max_len))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), tgt_v=st.integers(3, 8), k=st.integers(2, 5), alpha=st.sampled_from([0.0, 0.6]))
def test_beam_search_of_a_batch_is_each_example_alone(seed, tgt_v, k, alpha):
    model = tiny(seed, tgt_v)
    src = source(seed, 3, 5)
    src[1, 4:] = PAD
    out = beam_search(model, src, BOS, EOS, 8, beam_size=k, length_penalty=alpha)
    assert (out[:, 0] == BOS).all()
    for b in range(3):
        alone = beam_search(model, src[b:b + 1], BOS, EOS, 8, beam_size=k, length_penalty=alpha)[0]
        assert out[b, :len(alone)].tolist() == alone.tolist()
        assert (out[b, len(alone):] == PAD).all()


class Table(Transformer):
    """A Transformer whose next-token probabilities are written by hand: prefix -> {token: p}."""

    def __init__(self, table, vocab=8):
        super().__init__(TransformerConfig.tiny(5, vocab))
        self.table, self.vocab = table, vocab

    def encode(self, src):
        return torch.zeros(src.shape[0], 1, 1, dtype=DT), torch.ones(src.shape[0], 1, 1, 1, dtype=torch.bool)

    def decode_step(self, tgt, cache):
        logits = torch.full((tgt.shape[0], tgt.shape[1], self.vocab), -1e9, dtype=DT)  # (B, T, V)
        for b, row in enumerate(tgt.tolist()):
            prefix = tuple(t for t in row if t != PAD)
            for token, p in self.table.get(prefix, {EOS: 1.0}).items():  # unlisted prefixes stop
                logits[b, -1, token] = torch.log(torch.tensor(p, dtype=DT))
        return logits


A, B_, C, D = 3, 4, 5, 6
# After <s>, A looks better than B (0.55 > 0.45), but A's continuations are spread over three
# tokens while B is almost always followed by </s>: P(A C </s>) = 0.55 * 0.36 = 0.198 for greedy,
# P(B </s>) = 0.45 * 0.9 = 0.405 for a beam of two, which keeps B as its second hypothesis.
GARDEN_PATH = {(BOS,): {A: 0.55, B_: 0.45},
               (BOS, A): {C: 0.36, D: 0.34, EOS: 0.30},
               (BOS, B_): {EOS: 0.9, C: 0.1}}


def test_beam_search_beats_greedy_when_the_best_first_token_leads_nowhere():
    src = torch.tensor([[3]])
    greedy = greedy_decode(Table(GARDEN_PATH), src, BOS, EOS, 6)[0].tolist()
    beam = beam_search(Table(GARDEN_PATH), src, BOS, EOS, 6, beam_size=2, length_penalty=0.0)[0].tolist()
    assert greedy == [BOS, A, C, EOS]  # probability 0.198
    assert beam == [BOS, B_, EOS]  # probability 0.405, twice as likely


# A beam of two can also lose to greedy: after <s>, B's two continuations (0.45 * 0.5 each) beat
# greedy's A X (0.5 * 0.26), so the greedy path is pruned at step 2, and every path through B then
# spreads over five tokens and never ends: 0.225 * 0.2 per step, below greedy's 0.13 * 1.0.
PRUNED = {(BOS,): {A: 0.5, B_: 0.45, EOS: 0.05},
          (BOS, A): {C: 0.26, D: 0.25, 7: 0.25, EOS: 0.24},
          (BOS, A, C): {EOS: 1.0},
          (BOS, B_): {A: 0.5, C: 0.5}}
for _first in (A, C):
    PRUNED[(BOS, B_, _first)] = {t: 0.2 for t in (A, B_, C, D, 7)}


def test_a_narrow_beam_can_return_a_less_likely_output_than_greedy():
    src = torch.tensor([[3]])
    model = Table(PRUNED)
    greedy = greedy_decode(model, src, BOS, EOS, 4)[0].tolist()
    beam = beam_search(model, src, BOS, EOS, 4, beam_size=2, length_penalty=0.0)[0].tolist()
    assert greedy == [BOS, A, C, EOS]  # 0.5 * 0.26 * 1.0 = 0.13
    assert beam[:2] == [BOS, B_] and EOS not in beam  # 0.45 * 0.5 * 0.2 = 0.045, cut off at max_len
    wide = beam_search(model, src, BOS, EOS, 4, beam_size=64, length_penalty=0.0)[0].tolist()
    assert wide == greedy  # a wide enough beam finds the best again


# --- greedy with and without the cache: input checked once, no reads from the device in the step --------

@contextmanager
def count_host_reads():
    """Count the calls that copy a value from a tensor to Python (a wait for the device on a GPU)."""
    counts = {"n": 0}
    saved = {name: getattr(torch.Tensor, name) for name in ("__bool__", "item", "tolist", "nonzero")}

    def counting(original):
        def wrapper(self, *args, **kwargs):
            counts["n"] += 1
            return original(self, *args, **kwargs)
        return wrapper

    try:
        for name, original in saved.items():
            setattr(torch.Tensor, name, counting(original))
        yield counts
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)


def never_ending(seed):
    model = tiny(seed, 9)
    with torch.no_grad():
        model.head.bias[EOS] = -1e4  # no row ever finishes: every call runs max_len - 1 steps
    return model


@pytest.mark.parametrize("decode, most_per_step", [
    (greedy_decode, 1),  # the stop test `done.all()` after each step, nothing else
    (lambda *a: beam_search(*a, beam_size=3), 1),
    (lambda *a: greedy_decode_cached(*a, check_every=16), 0),  # one read per 16 steps
])
def test_decoders_read_from_the_device_a_fixed_number_of_times_per_step(decode, most_per_step):
    """The ids are checked once per call: more steps add no checks (each would read `bad.any()`)."""
    model, src = never_ending(0), source(0, 2, 6)
    reads = []
    for max_len in (4, 36):
        with count_host_reads() as counts:
            decode(model, src, BOS, EOS, max_len)
        reads.append(counts["n"])
    extra_steps = 36 - 4
    assert reads[1] - reads[0] <= most_per_step * extra_steps + 2, reads


def test_cached_step_reads_nothing_from_the_device():
    model = never_ending(1)
    src = source(1, 2, 6)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_decode_cache(memory, 10, static=True, src_mask=src_mask)
        ys = torch.full((2, 10), PAD)
        ys[:, 0] = BOS
        token, done = ys[:, :1].clone(), torch.zeros(2, dtype=torch.bool)
        step = _greedy_step(model, cache, ys, token, done, EOS)
        with count_host_reads() as counts:
            for _ in range(9):
                step()
    assert counts["n"] == 0
    assert torch.equal(ys, greedy_decode(model, src, BOS, EOS, 10))


def test_cached_greedy_checks_its_arguments():
    model = never_ending(2)
    with pytest.raises(ValueError, match="check_every must be a positive int, got 0"):
        greedy_decode_cached(model, source(2, 1, 4), BOS, EOS, 5, check_every=0)
    with pytest.raises(ValueError, match="cuda_graph=True needs a CUDA device"):
        greedy_decode_cached(model, source(2, 1, 4), BOS, EOS, 5, cuda_graph=True)
    with pytest.raises(ValueError, match=r"src holds token id 99"):
        greedy_decode_cached(model, torch.tensor([[3, 99]]), BOS, EOS, 5)


@pytest.mark.parametrize("check_every", [1, 3, 16])
def test_cached_greedy_cuts_where_greedy_stops_whatever_the_check_interval(check_every):
    for seed in range(6):
        model = tiny(seed, 4)  # 4 target ids: rows finish early, at different steps
        src = source(seed, 3, 5)
        expected = greedy_decode(model, src, BOS, EOS, 20)
        assert torch.equal(greedy_decode_cached(model, src, BOS, EOS, 20, check_every=check_every), expected)


# --- CUDA only (skipped on CPU machines) ----------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_graph_decoding_equals_uncached_greedy(dtype):
    for seed in range(4):
        model = tiny(seed, 6).to("cuda", dtype)
        src = source(seed, 3, 7).cuda()
        src[0, 5:] = PAD
        expected = greedy_decode(model, src, BOS, EOS, 40)
        for graph in (True, False):
            assert torch.equal(greedy_decode_cached(model, src, BOS, EOS, 40, cuda_graph=graph), expected)


@cuda
def test_cuda_step_never_synchronises():
    model = never_ending(3).to("cuda")
    src = source(3, 2, 6).cuda()
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_decode_cache(memory, 10, static=True, src_mask=src_mask)
        ys = torch.full((2, 10), PAD, device="cuda")
        ys[:, 0] = BOS
        token, done = ys[:, :1].clone(), torch.zeros(2, dtype=torch.bool, device="cuda")
        step = _greedy_step(model, cache, ys, token, done, EOS)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
        try:
            for _ in range(9):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(ys, greedy_decode(model, src, BOS, EOS, 10))


# --- beam search against a plain reference, on many random cases ---------------------------------------

@torch.no_grad()
def reference_beam_search(model, src, max_len, k, alpha):
    """Beam search for ONE source, written with Python lists: (tokens, score, finished) per hypothesis.

    The same rules as helpers.decoding.beam_search: a finished hypothesis continues with pad at no
    cost; the k best candidates survive (sorted by score); the best normalised score wins, |Y| being
    the tokens after BOS up to and including eos.
    """
    beams = [((BOS,), 0.0, False, 0)]  # tokens, summed log-probability, finished, |Y|
    for _ in range(max_len - 1):
        candidates = []
        for tokens, score, finished, n in beams:
            if finished:
                candidates.append((tokens + (PAD,), score, True, n))
                continue
            log_probs = torch.log_softmax(model(src, torch.tensor([tokens]))[0, -1].double(), dim=-1).tolist()
            candidates += [(tokens + (v,), score + lp, v == EOS, n + 1) for v, lp in enumerate(log_probs)]
        beams = sorted(candidates, key=lambda c: -c[1])[:k]
        if all(finished for _, _, finished, _ in beams):
            break
    tokens, _, _, n = max(beams, key=lambda b: b[1] / penalty(b[3], alpha))
    return list(tokens[:1 + n])


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 100_000), tgt_v=st.integers(3, 5), k=st.integers(2, 3), max_len=st.integers(3, 7),
       alpha=st.sampled_from([0.6, 2.0, 5.0]), B=st.integers(1, 2))
def test_beam_search_equals_a_plain_reference(seed, tgt_v, k, max_len, alpha, B):
    """Catches bookkeeping that does not follow the beams when they are reordered (lengths, done flags)."""
    model = tiny(seed, tgt_v)
    src = source(seed, B, 4)
    out = beam_search(model, src, BOS, EOS, max_len, beam_size=k, length_penalty=alpha)
    for b in range(B):
        expected = reference_beam_search(model, src[b:b + 1], max_len, k, alpha)
        assert out[b, :len(expected)].tolist() == expected
        assert (out[b, len(expected):] == PAD).all()


# --- cached greedy equals uncached greedy (the Transformer) ---------------------------------------

def tiny_model(seed, src_v=9, tgt_v=7, dtype=torch.float64, **overrides):
    torch.manual_seed(seed)
    return Transformer(TransformerConfig.tiny(src_v, tgt_v, **overrides)).to(dtype).eval()


@given(seed=st.integers(0, 10_000), norm_first=st.booleans(), n_heads=st.sampled_from([1, 2, 4]),
       layers=st.integers(1, 2), B=st.integers(1, 3), S=st.integers(1, 6), n_pad=st.integers(0, 2),
       tgt_v=st.integers(4, 9), max_len=st.integers(2, 14))
def test_cached_greedy_equals_uncached(seed, norm_first, n_heads, layers, B, S, n_pad, tgt_v, max_len):
    # small target vocabularies make the model emit eos and pad ids: rows stop at different steps
    model = tiny_model(seed, tgt_v=tgt_v, norm_first=norm_first, n_heads=n_heads,
                       n_encoder_layers=layers, n_decoder_layers=layers)
    src = source(seed, B, S, 9, n_pad=min(n_pad, S - 1))
    expected = greedy_decode(model, src, BOS, EOS, max_len)
    got = greedy_decode_cached(model, src, BOS, EOS, max_len)
    assert torch.equal(got, expected), f"\n{got}\n{expected}"


def test_cached_greedy_covers_early_stop_and_generated_pads():
    """The property test above must reach the interesting branches; this pins one case that does."""
    hits = {"stopped_early": False, "generated_pad": False}
    for seed in range(40):
        model = tiny_model(seed, tgt_v=4)
        src = source(seed, 3, 5, 9, n_pad=2)
        out = greedy_decode(model, src, BOS, EOS, 12)
        assert torch.equal(greedy_decode_cached(model, src, BOS, EOS, 12), out)
        hits["stopped_early"] |= out.shape[1] < 12
        body = out[:, 1:]
        before_eos = torch.cumsum(body == EOS, dim=1) == 0
        hits["generated_pad"] |= bool(((body == PAD) & before_eos).any())
        if all(hits.values()):
            break
    assert all(hits.values()), hits


def test_cached_greedy_float32_lesson08_sizes_and_no_early_eos():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.dates(20, 14)).eval()
    assert model.config.max_len == 512
    with torch.no_grad():
        model.head.bias[EOS] = -1e4  # the trick the lesson and the benchmark use
    src = source(0, 2, 12, 20)
    out = greedy_decode_cached(model, src, BOS, EOS, 24)
    assert out.shape == (2, 24) and not (out == EOS).any()
    assert torch.equal(out, greedy_decode(model, src, BOS, EOS, 24))


def test_cached_greedy_restores_training_mode_and_checks_arguments():
    model = tiny_model(1).train()
    greedy_decode_cached(model, source(1, 1, 4, 9), BOS, EOS, 5)
    assert model.training
    with pytest.raises(ValueError, match=r"bos_id \(a target token id\) must be an int in \[0, 6\], got 99"):
        greedy_decode_cached(model, source(1, 1, 4, 9), 99, EOS, 5)
    with pytest.raises(ValueError, match=r"max_len .* got 1000"):
        greedy_decode_cached(model, source(1, 1, 4, 9), BOS, EOS, 1000)


# --- greedy and beam search on the plain and a scripted Transformer -------------------------------

SRC_V, TGT_V = 13, 11
X, Y = 4, 5  # two ordinary target tokens of the scripted distribution


def ids(B, L, V, seed, low=3):
    """(B, L) random non-special ids in [low, V)."""
    return torch.randint(low, V, (B, L), generator=torch.Generator().manual_seed(seed))


def make_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return Transformer(TransformerConfig.tiny(SRC_V, TGT_V, **overrides)).to(DT).eval()


MODEL = make_model(seed=11)


def test_greedy_decode_layout_and_stops_at_eos():
    src = ids(4, 6, SRC_V, 3)
    out = greedy_decode(MODEL, src, BOS, EOS, max_len=12)
    assert out.dtype == torch.long and out.shape[0] == 4 and 2 <= out.shape[1] <= 12
    assert (out[:, 0] == BOS).all()
    for row in out.tolist():
        if EOS in row:
            after = row[row.index(EOS) + 1:]
            assert all(t == PAD for t in after)
    # every row's tokens are the argmax of the model's logits on its own prefix
    logits = MODEL(src, out[:, :-1])
    pred = logits.argmax(-1)
    for b, row in enumerate(out.tolist()):
        end = row.index(EOS) if EOS in row else len(row) - 1
        assert pred[b, :end].tolist() == row[1:end + 1]


def test_greedy_decode_stops_once_every_row_has_eos():
    model = make_model(seed=5)
    with torch.no_grad():  # make eos the runaway favourite
        model.head.bias.zero_()
        model.head.bias[EOS] = 100.0
    out = greedy_decode(model, ids(3, 4, SRC_V, 0), BOS, EOS, max_len=20)
    assert out.tolist() == [[BOS, EOS]] * 3


class Scripted(Transformer):
    """A Transformer whose next-token distribution is written by hand, to test the decoders exactly.

    encode() hands the source ids on as the "memory"; decode_step() looks up the last position's
    distribution in ``table`` (prefix -> {token: probability}) or, without a table, emits eos once
    the prefix is as long as the row's first source id and token 3 before that.
    """

    def __init__(self, table=None):
        super().__init__(TransformerConfig.tiny(SRC_V, TGT_V))
        self.table = table

    def encode(self, src):
        return src.to(DT)[..., None], torch.ones(src.shape[0], 1, 1, src.shape[1], dtype=torch.bool)

    def decode_step(self, tgt, cache):
        B, T, memory = *tgt.shape, cache.memory
        logits = torch.full((B, T, TGT_V), -1e9, dtype=DT)  # (B, T, V)
        for b, row in enumerate(tgt.tolist()):
            if self.table is None:
                logits[b, -1, EOS if T >= memory[b, 0, 0] else 3] = 0.0
            else:
                for token, prob in self.table.get(tuple(row), {EOS: 1.0}).items():  # unlisted: stop
                    logits[b, -1, token] = torch.log(torch.tensor(prob, dtype=DT))
        return logits


def test_greedy_decode_pads_rows_that_finished_early():
    out = greedy_decode(Scripted(), torch.tensor([[1], [3], [2]]), BOS, EOS, max_len=10)
    assert out.tolist() == [[BOS, EOS, PAD, PAD], [BOS, 3, 3, EOS], [BOS, 3, EOS, PAD]]
    cut = greedy_decode(Scripted(), torch.tensor([[1], [9]]), BOS, EOS, max_len=4)  # row 1 hits max_len
    assert cut.tolist() == [[BOS, EOS, PAD, PAD], [BOS, 3, 3, 3]]


BEAM_TABLE = {(BOS,): {EOS: 0.4, X: 0.6}, (BOS, X): {EOS: 0.6, Y: 0.4}, (BOS, X, Y): {EOS: 1.0}}


@pytest.mark.parametrize("beam_size, alpha, expected", [
    (1, 0.0, [BOS, X, EOS]),  # greedy: 0.6 * 0.6 = 0.36
    (4, 0.0, [BOS, EOS]),  # the beam finds the more likely short answer, 0.4
    (4, 3.0, [BOS, X, Y, EOS]),  # a strong length penalty favours the longest: log(0.24) / (8/6)^3
])
def test_beam_search_on_a_hand_written_distribution(beam_size, alpha, expected):
    out = beam_search(Scripted(BEAM_TABLE), torch.tensor([[3]]), BOS, EOS, max_len=6,
                      beam_size=beam_size, length_penalty=alpha)
    assert out[0].tolist() == expected


def test_decoders_restore_training_mode():
    model = make_model(dropout=0.2).train()
    greedy_decode(model, ids(1, 3, SRC_V, 0), BOS, EOS, 5)
    beam_search(model, ids(1, 3, SRC_V, 0), BOS, EOS, 5)
    assert model.training


@settings(max_examples=15)  # each example decodes up to 10 steps twice
@given(seed=st.integers(0, 10_000), B=st.integers(1, 3))
def test_beam_size_one_equals_greedy(seed, B):
    src = ids(B, 5, SRC_V, seed)
    src[0, 3:] = PAD
    g = greedy_decode(MODEL, src, BOS, EOS, max_len=10)
    b = beam_search(MODEL, src, BOS, EOS, max_len=10, beam_size=1)
    assert torch.equal(g, b)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 3.0])
def test_exhaustive_beam_finds_the_best_normalised_hypothesis(alpha):
    """With a beam wider than the whole search space, beam search must return the brute-force optimum."""
    src = ids(1, 5, SRC_V, 4)
    lp = lambda n: ((5 + n) / 6) ** alpha  # noqa: E731  (Wu et al. 2016, |Y| = tokens after BOS)
    logp1 = torch.log_softmax(MODEL(src, torch.tensor([[BOS]]))[0, 0], -1)  # (V,)
    candidates = {(BOS, EOS): logp1[EOS].item() / lp(1)}
    for y1 in range(TGT_V):
        if y1 == EOS:
            continue
        logp2 = torch.log_softmax(MODEL(src, torch.tensor([[BOS, y1]]))[0, 1], -1)  # (V,)
        for y2 in range(TGT_V):  # max_len 3: either ends in eos or is cut off at length 3
            candidates[(BOS, y1, y2)] = (logp1[y1] + logp2[y2]).item() / lp(2)
    best = max(candidates, key=candidates.get)
    out = beam_search(MODEL, src, BOS, EOS, max_len=3, beam_size=200, length_penalty=alpha)
    assert tuple(out[0].tolist()) == best


def test_beam_search_batch_layout():
    src = ids(3, 4, SRC_V, 2)
    out = beam_search(MODEL, src, BOS, EOS, max_len=9, beam_size=3)
    assert out.shape[0] == 3 and out.shape[1] <= 9 and (out[:, 0] == BOS).all()
    for b in range(3):  # each row is what searching that example alone gives
        alone = beam_search(MODEL, src[b:b + 1], BOS, EOS, max_len=9, beam_size=3)[0]
        assert out[b, :alone.shape[0]].tolist() == alone.tolist()


@pytest.mark.parametrize("kwargs, words", [
    (dict(max_len=1), ["max_len", "1"]),
    (dict(max_len=65), ["max_len", "64"]),
    (dict(bos_id=PAD), ["bos_id", "pad_id"]),
    (dict(eos_id=TGT_V), ["eos_id", str(TGT_V)]),
])
def test_decode_arguments_are_checked(kwargs, words):
    args = dict(bos_id=BOS, eos_id=EOS, max_len=5) | kwargs
    with pytest.raises(ValueError) as err:
        greedy_decode(MODEL, ids(1, 3, SRC_V, 0), **args)
    for w in words:
        assert w in str(err.value)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(MODEL, ids(1, 3, SRC_V, 0), BOS, EOS, 5, beam_size=0)


# --- a GPT to generate from --------------------------------------------------------------------------

GPT_V = 11


def gpt_model(seed=0, **overrides):
    torch.manual_seed(seed)
    model = GPT(GPTConfig.tiny(GPT_V, **overrides)).to(DT).eval()
    with torch.no_grad():  # non-trivial LayerNorm and bias values
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def gpt_ids(B, T, seed=0, vocab=GPT_V):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# --- generation (helpers.decoding.generate, through GPT.generate) ---------------------------------

@pytest.mark.parametrize("n_kv_heads", [None, 1])
@pytest.mark.parametrize("knobs", [dict(top_k=1), dict(), dict(temperature=0.7, top_k=4), dict(top_p=0.8)])
def test_generate_cached_equals_uncached(n_kv_heads, knobs):
    model = gpt_model(n_kv_heads=n_kv_heads)
    prompt = gpt_ids(3, 4, seed=3)
    a = model.generate(prompt, 20, generator=torch.Generator().manual_seed(5), use_cache=True, **knobs)
    b = model.generate(prompt, 20, generator=torch.Generator().manual_seed(5), use_cache=False, **knobs)
    assert a.shape == (3, 24) and torch.equal(a[:, :4], prompt)
    assert torch.equal(a, b)


def test_top_k_1_is_greedy():
    model = gpt_model()
    ids = gpt_ids(2, 3)
    out = model.generate(ids, 10, top_k=1)
    expected = ids
    for _ in range(10):
        expected = torch.cat([expected, model(expected)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, expected)


def test_generate_draws_one_multinomial_per_step_from_the_generator():
    model = gpt_model()
    ids = gpt_ids(2, 3)
    g = torch.Generator().manual_seed(11)
    out = model.generate(ids, 6, temperature=0.9, top_p=0.9, generator=g)
    g2 = torch.Generator().manual_seed(11)
    mine = ids
    for _ in range(6):  # a learner's sampler: same filter, one draw per step for the batch
        probs = torch.softmax(filter_logits(model(mine)[:, -1], 0.9, None, 0.9).float(), dim=-1)
        mine = torch.cat([mine, torch.multinomial(probs, 1, generator=g2)], dim=1)
    assert torch.equal(out, mine)
    assert torch.equal(g.get_state(), g2.get_state())


def lively_model(seed=0, **overrides):
    """A tiny GPT with std-1 weights: its logits change a lot with the position and the context, so a
    step that reuses stale logits, or a position off by one, changes the tokens."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig.tiny(GPT_V, max_len=8, **overrides)).to(DT).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 1.0)
    return model


def cropped_reference(model, ids, n_new):
    """Greedy generation written as nanoGPT does: the full model on the last max_len tokens, each step."""
    out = ids
    special = list(model.config.special_ids)
    for _ in range(n_new):
        logits = model(out[:, -model.config.max_len:])[:, -1]  # (B, GPT_V)
        logits[:, special] = -math.inf
        out = torch.cat([out, logits.argmax(-1, keepdim=True)], dim=1)
    return out


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("prompt_len", [1, 8])
def test_generate_runs_past_max_len_with_the_cropped_context(seed, prompt_len):
    model = lively_model(seed, special_ids=(0,))
    prompt = gpt_ids(2, prompt_len, seed=seed)
    n_new = 3 * model.config.max_len
    expected = cropped_reference(model, prompt, n_new)
    for use_cache in (True, False):
        out = model.generate(prompt, n_new, top_k=1, use_cache=use_cache)
        assert out.shape == (2, prompt_len + n_new)
        assert torch.equal(out, expected), use_cache


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("knobs", [dict(top_k=1), dict(temperature=2.0), dict(top_p=0.9)])
def test_generate_cached_equals_uncached_on_a_lively_model(seed, knobs):
    """Every step's logits, the last one included, come from the newest token at its own position."""
    model = lively_model(seed)
    prompt = gpt_ids(3, 2, seed=seed)
    for n_new in (1, 2, 5, 6):  # the cache fills up exactly at max_len = 8 tokens
        a = model.generate(prompt, n_new, generator=torch.Generator().manual_seed(seed), use_cache=True, **knobs)
        b = model.generate(prompt, n_new, generator=torch.Generator().manual_seed(seed), use_cache=False, **knobs)
        assert torch.equal(a, b), n_new


def test_generate_never_samples_the_special_ids():
    model, vocab = load_course_gpt()
    assert model.config.special_ids == (vocab.pad_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2)
    prompt = torch.tensor([vocab.encode("ROMEO:")])
    out = model.generate(prompt, 150, temperature=100.0, generator=torch.Generator().manual_seed(0))
    new = out[0, prompt.shape[1]:]
    assert not torch.isin(new, torch.tensor([0, 1, 2])).any()
    assert len(set(new.tolist())) > 20  # near-uniform draws: without the rule, specials would appear
    # a config of its own: the ids it names are never drawn either
    tiny = GPT(GPTConfig.tiny(GPT_V, special_ids=(3, 4)))
    out = tiny.generate(gpt_ids(4, 2), 60, temperature=50.0, generator=torch.Generator().manual_seed(1))
    assert not torch.isin(out[:, 2:], torch.tensor([3, 4])).any()


def test_generate_restores_training_mode_and_zero_new_tokens():
    model = gpt_model().train()
    ids = gpt_ids(1, 4)
    assert torch.equal(model.generate(ids, 0), ids)
    assert model.training


# --- filter_logits --------------------------------------------------------------------------------

def reference_filter(logits, temperature, top_k, top_p):
    """One row, in plain Python: the semantics of DESIGN.md written out."""
    x = [v / temperature for v in logits]
    keep = [True] * len(x)
    if top_k is not None:
        order = sorted(range(len(x)), key=lambda i: -x[i])  # stable: ties keep index order
        keep = [i in set(order[:top_k]) for i in range(len(x))]
    if top_p is not None and top_p < 1.0:
        m = max(x[i] for i in range(len(x)) if keep[i])
        e = [math.exp(x[i] - m) if keep[i] else 0.0 for i in range(len(x))]
        p = [v / sum(e) for v in e]
        order = sorted(range(len(x)), key=lambda i: -p[i])
        total, kept = 0.0, set()
        for i in order:
            if total >= top_p and kept:
                break
            kept.add(i)
            total += p[i]
        keep = [keep[i] and i in kept for i in range(len(x))]
    return [x[i] if keep[i] else -math.inf for i in range(len(x))]


@settings(max_examples=200, deadline=None)
@given(logits=st.lists(st.floats(-8, 8, allow_nan=False).map(lambda v: round(v, 3)), min_size=1, max_size=12,
                       unique=True),
       temperature=st.sampled_from([0.5, 1.0, 2.0]), top_k=st.one_of(st.none(), st.integers(1, 14)),
       top_p=st.one_of(st.none(), st.sampled_from([0.1, 0.5, 0.9, 0.999, 1.0])))
def test_filter_logits_semantics(logits, temperature, top_k, top_p):
    out = filter_logits(torch.tensor(logits, dtype=DT), temperature, top_k, top_p)
    expected = torch.tensor(reference_filter(logits, temperature, top_k, top_p), dtype=DT)
    assert torch.equal(torch.isinf(out), torch.isinf(expected))
    kept = ~torch.isinf(out)
    assert kept.any()  # at least one token always stays
    assert torch.allclose(out[kept], expected[kept], rtol=0, atol=1e-12)
    if top_k is not None:
        assert int(kept.sum()) <= top_k


def test_filter_logits_top_p_examples():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=DT)
    kept = lambda p: (~torch.isinf(filter_logits(probs.log(), top_p=p))).tolist()  # noqa: E731
    assert kept(0.45) == [True, False, False, False]  # the first token alone reaches 0.45
    assert kept(0.6) == [True, True, False, False]  # the token that crosses 0.6 is kept
    assert kept(0.01) == [True, False, False, False]  # at least one
    assert kept(1.0) == [True, True, True, True]
    batch = filter_logits(torch.stack([probs.log(), probs.flip(0).log()]), top_p=0.6)  # rows apart
    assert (~torch.isinf(batch)).tolist() == [[True, True, False, False], [False, False, True, True]]


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=0.0), "temperature"), (dict(temperature=-1.0), "temperature"),
    (dict(top_k=0), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
])
def test_filter_logits_bad_knobs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        filter_logits(torch.zeros(5), **kwargs)


def test_filter_logits_computes_in_float32_at_least():
    logits = torch.tensor([[3.0, 1.0, -2.0, 0.5]], dtype=torch.float16)
    out = filter_logits(logits, temperature=1e-4)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert torch.softmax(out, -1)[0, 0] == 1.0  # the largest logit takes it all, no NaN
    assert filter_logits(logits.double(), 0.5).dtype == torch.float64


def test_filter_logits_refuses_nan():
    with pytest.raises(ValueError, match=r"logits hold NaN \(first at index \(1, 2\) of \(2, 4\)\)"):
        filter_logits(torch.tensor([[0.0, 1.0, 2.0, 3.0], [0.0, 1.0, math.nan, 3.0]]), top_p=0.5)


def test_filter_logits_keeps_inf_tokens_under_top_p():
    logits = torch.tensor([[0.0, math.inf, 5.0, math.inf], [1.0, 2.0, 3.0, 4.0]])
    out = filter_logits(logits, top_p=0.6)  # the two +inf tokens share the row's probability, 0.5 each
    assert torch.isposinf(out[0, [1, 3]]).all() and torch.isneginf(out[0, [0, 2]]).all()
    assert (~torch.isinf(out[1])).tolist() == [False, False, False, True]


def test_filter_logits_bad_logits():
    with pytest.raises(ValueError, match="floating"):
        filter_logits(torch.zeros(5, dtype=torch.long))


# --- the RNN encoder-decoder (lesson 01): greedy_decode_rnn over Seq2Seq.decode_step ----------------------

def rnn_model(kind, seed, V, bidirectional=True, bos_id=BOS, eos_id=EOS):
    """A float64 Seq2Seq over V target tokens: kind "fixed" (one context vector), "states" or "embeddings"."""
    torch.manual_seed(seed)
    enc = Encoder(9, 6, 5, bidirectional=bidirectional)
    if kind == "fixed":
        dec = Decoder(V, 6, 7, enc.out_dim)
    else:
        dec = AttentionDecoder(V, 6, 7, enc.out_dim, 4, value_dim=6 if kind == "embeddings" else None)
    model = Seq2Seq(enc, dec, read="states" if kind == "fixed" else kind, bos_id=bos_id, eos_id=eos_id).to(DT)
    with torch.no_grad():
        dec.out.weight.mul_(3.0)  # sharper next-token distributions: the choices depend on the inputs
    return model


@torch.no_grad()
def rnn_greedy_by_hand(model, src, max_len):
    """Lesson 01's greedy loop written out over the decoder itself: feed back the argmax max_len times,
    then blank every position after a row's first </s>, one row at a time."""
    memory = model.start(src)
    token = torch.full((src.shape[0], 1), model.bos_id)  # (B, 1)
    columns, weights = [], []
    for _ in range(max_len):
        logits, memory, a = model.decoder(token, memory)  # (B, 1, V), memory, (B, 1, S) or None
        token = logits.argmax(dim=-1)  # (B, 1)
        columns.append(token)
        weights.append(a)
    rows = torch.cat(columns, dim=1).tolist()  # B lists of max_len ids
    for row in rows:
        if model.eos_id in row:
            first = row.index(model.eos_id)
            row[first + 1:] = [model.pad_id] * (len(row) - first - 1)
    return torch.tensor(rows), (None if weights[0] is None else torch.cat(weights, dim=1))


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["fixed", "states", "embeddings"]), bidirectional=st.booleans(),
       seed=st.integers(0, 10_000), V=st.integers(3, 6), lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       max_len=st.integers(1, 9), special=st.sampled_from([(BOS, EOS), (2, 1), (1, 0), (2, 2)]))
def test_rnn_greedy_equals_the_loop_written_out(kind, bidirectional, seed, V, lengths, max_len, special):
    """Ids and weights exactly as the loop Seq2Seq.greedy_decode ran before it moved to helpers.decoding,
    the steps after </s> included (its weights are those of the model's own tokens fed back)."""
    model = rnn_model(kind, seed, V, bidirectional, *special)
    g = torch.Generator().manual_seed(seed)
    src = torch.zeros(len(lengths), max(lengths), dtype=torch.long)  # (B, S), pad_id 0 on the right
    for b, n in enumerate(lengths):
        src[b, :n] = torch.randint(3, 9, (n,), generator=g)
    expected_ids, expected_weights = rnn_greedy_by_hand(model, src, max_len)
    ids, weights = greedy_decode_rnn(model, src, max_len, return_attention=True)
    assert torch.equal(ids, expected_ids)
    assert weights is None if kind == "fixed" else torch.equal(weights, expected_weights)
    assert torch.equal(model.greedy_decode(src, max_len), expected_ids)


def test_rnn_greedy_keeps_feeding_its_own_tokens_after_eos():
    """A row that wrote </s> early still runs every step on its own (unpadded) tokens: its weights there
    are teacher forcing's on those tokens, and its ids are pads."""
    model = rnn_model("states", 5, 4)
    src = torch.tensor([[3, 4, 5, 6, 7], [8, 7, 6, 0, 0]])
    ids, weights = greedy_decode_rnn(model, src, 8, return_attention=True)
    with torch.no_grad():
        memory, token, raw = model.start(src), torch.full((2, 1), BOS), []
        for _ in range(8):
            logits, memory, _ = model.decoder(token, memory)
            token = logits.argmax(-1)
            raw.append(token)
    raw = torch.cat(raw, dim=1)  # (2, 8): the tokens fed back, before the pads
    first = [row.index(EOS) for row in raw.tolist()]
    assert first == [1, 1], raw  # </s> early in both rows: most steps run after it
    assert all(ids[b, first[b] + 1:].eq(PAD).all() and not raw[b, first[b] + 1:].eq(PAD).all() for b in range(2))
    tgt_in = torch.cat([torch.full((2, 1), BOS), raw[:, :-1]], dim=1)  # (2, 8)
    _, forced = model(src, tgt_in)
    torch.testing.assert_close(weights, forced)


@pytest.mark.parametrize("kind", ["fixed", "states", "embeddings"])
def test_rnn_decode_step_reads_each_token_once(kind):
    """decode_step advances the cache's state past the ids it reads: steps of 3, 1 and 2 tokens give
    teacher forcing's logits and weights of all 6."""
    model = rnn_model(kind, 1, 6)
    src = torch.tensor([[3, 4, 5], [6, 7, 0]])
    tgt_in = torch.tensor([[BOS, 3, 4, 5, 3, 4], [BOS, 5, 5, 4, 3, 3]])
    with torch.no_grad():
        logits, weights = model(src, tgt_in)
        cache = model.new_decode_cache(src)
        steps = [model.decode_step(tgt_in[:, i:j], cache) for i, j in ((0, 3), (3, 4), (4, 6))]
    torch.testing.assert_close(torch.cat(steps, dim=1), logits, rtol=0, atol=1e-12)
    assert len(cache.weights) == 3
    if kind == "fixed":
        assert weights is None and cache.weights == [None] * 3
    else:
        torch.testing.assert_close(torch.cat(cache.weights, dim=1), weights, rtol=0, atol=1e-12)
