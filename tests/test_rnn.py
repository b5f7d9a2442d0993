"""helpers.rnn (lesson 01): the GRU encoder-decoder with and without additive attention."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from helpers.attention import AdditiveAttention
from helpers.rnn import AttentionDecoder, Decoder, Encoder, Seq2Seq, source_mask

V, EMB, HID = 13, 6, 5  # vocabulary, embedding width, encoder hidden width per direction
PAD, BOS, EOS = 0, 1, 2


def make(attention, bidirectional: bool = True, dtype=torch.float64, seed: int = 0) -> Seq2Seq:
    """attention: False (fixed context), True or "states" (reads the states), "embeddings"."""
    torch.manual_seed(seed)
    enc = Encoder(V, EMB, HID, bidirectional=bidirectional)
    E = enc.out_dim
    if not attention:
        return Seq2Seq(enc, Decoder(V, EMB, 7, E)).to(dtype)
    read = "embeddings" if attention == "embeddings" else "states"
    dec = AttentionDecoder(V, EMB, 7, E, 4, value_dim=EMB if read == "embeddings" else None)
    return Seq2Seq(enc, dec, read=read).to(dtype)


def random_src(lengths, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    src = torch.full((len(lengths), S), PAD, dtype=torch.long)  # (B, S)
    for b, n in enumerate(lengths):
        src[b, :n] = torch.randint(3, V, (n,), generator=g)
    return src


def random_tgt(B, T, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tgt = torch.randint(3, V, (B, T), generator=g)  # (B, T)
    tgt[:, 0] = BOS
    return tgt


both = pytest.mark.parametrize("attention", [False, True, "embeddings"], ids=["fixed", "attention", "reads-emb"])
attentive = pytest.mark.parametrize("read", ["states", "embeddings"])


# ----- shapes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bidirectional", [False, True])
def test_encoder_shapes(bidirectional):
    model = make(True, bidirectional)
    states, final = model.encoder(random_src([4, 2, 3]))
    E = HID * (2 if bidirectional else 1)
    assert model.encoder.out_dim == E
    assert states.shape == (3, 4, E) and final.shape == (3, E)


@both
def test_seq2seq_shapes(attention):
    model = make(attention)
    src, tgt_in = random_src([5, 3]), random_tgt(2, 4)
    logits, weights = model(src, tgt_in)
    assert logits.shape == (2, 4, V)
    if attention:
        assert weights.shape == (2, 4, 5)
    else:
        assert weights is None
    ids, w = model.greedy_decode(src, 6, return_attention=True)
    assert ids.shape == (2, 6) and ids.dtype == torch.long
    assert (w is None) if not attention else w.shape == (2, 6, 5)
    assert torch.equal(model.greedy_decode(src, 6), ids)


# ----- the encoder against an oracle: nn.GRU run on each row alone, without padding ---------------

@pytest.mark.parametrize("bidirectional", [False, True])
def test_encoder_equals_unpadded_gru_per_row(bidirectional):
    model = make(True, bidirectional)
    enc = model.encoder
    lengths = [6, 2, 4]
    src = random_src(lengths)
    states, final = enc(src)
    oracle = nn.GRU(EMB, HID, batch_first=True, bidirectional=bidirectional).double()
    oracle.load_state_dict(enc.gru.state_dict())
    for b, n in enumerate(lengths):
        out, h_n = oracle(enc.embed(src[b:b + 1, :n]))  # (1, n, E), (dirs, 1, HID)
        torch.testing.assert_close(states[b, :n], out[0])
        torch.testing.assert_close(final[b], h_n[:, 0].reshape(-1))
        assert torch.all(states[b, n:] == 0), "states at padded positions must be zero"
    if bidirectional:  # the summary is [forward state at the last token, backward state at the first]
        for b, n in enumerate(lengths):
            torch.testing.assert_close(final[b], torch.cat([states[b, n - 1, :HID], states[b, 0, HID:]]))


# ----- the attention read equals helpers.attention.AdditiveAttention ------------------------------

@attentive
def test_attend_equals_additive_attention_module(read):
    model = make(read)
    dec = model.decoder
    src = random_src([5, 3, 4])
    states, final = model.encoder(src)
    mask = source_mask(src)
    values = states if read == "states" else model.encoder.embed(src)
    memory = model.start(src)
    c, a = dec.attend(memory[0], memory)
    c_ref, a_ref = dec.attention(memory[0][:, None], states, values, mask=mask[:, None])
    torch.testing.assert_close(c, c_ref[:, 0])
    torch.testing.assert_close(a, a_ref[:, 0])
    assert c.shape == (3, values.shape[-1])


@attentive
def test_attention_decoder_step_by_hand(read):
    """Bahdanau et al. 2015: c_i from s_{i-1}, then s_i = GRU([e(y_{i-1}); c_i], s_{i-1})."""
    model = make(read)
    dec = model.decoder
    src, tgt_in = random_src([4, 2]), random_tgt(2, 3)
    logits, weights = model(src, tgt_in)
    states, final = model.encoder(src)
    values = states if read == "states" else model.encoder.embed(src)
    mask = source_mask(src)
    oracle = AdditiveAttention(7, 2 * HID, 4).double()
    oracle.load_state_dict(dec.attention.state_dict())
    s = torch.tanh(final @ dec.init_state.weight.T + dec.init_state.bias)
    for i in range(3):
        c, a = oracle(s[:, None], states, values, mask=mask[:, None])  # (B, 1, Dv), (B, 1, S)
        e = dec.embed(tgt_in[:, i])
        s = dec.cell(torch.cat([e, c[:, 0]], -1), s)
        torch.testing.assert_close(weights[:, i], a[:, 0])
        torch.testing.assert_close(logits[:, i], dec.out(torch.cat([s, c[:, 0], e], -1)))


def test_read_embeddings_context_is_a_mix_of_source_embeddings():
    model = make("embeddings")
    src = random_src([4, 3])
    _, weights = model(src, random_tgt(2, 2))
    memory = model.start(src)
    c, a = model.decoder.attend(memory[0], memory)
    torch.testing.assert_close(c, torch.einsum("bs,bse->be", a, model.encoder.embed(src)))
    assert weights.shape == (2, 2, 4)


# ----- teacher forcing vs step by step -------------------------------------------------------------

@both
def test_teacher_forcing_equals_one_step_at_a_time(attention):
    model = make(attention)
    src, tgt_in = random_src([5, 3, 4]), random_tgt(3, 6)
    logits, weights = model(src, tgt_in)
    memory = model.start(src)
    for i in range(6):
        step_logits, memory, a = model.decoder(tgt_in[:, i:i + 1], memory)
        torch.testing.assert_close(step_logits[:, 0], logits[:, i])
        if attention:
            torch.testing.assert_close(a[:, 0], weights[:, i])


@both
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_decode_agrees_with_teacher_forcing_on_its_own_output(attention, seed):
    model = make(attention, seed=seed)
    src = random_src([5, 3, 4], seed=seed)
    ids, w = model.greedy_decode(src, 7, return_attention=True)
    tgt_in = torch.cat([torch.full((3, 1), BOS), ids[:, :-1].clamp_min(0)], dim=1)  # (B, T)
    logits, weights = model(src, tgt_in)
    pred = logits.argmax(-1)
    for b in range(3):
        stop = (ids[b] == EOS).nonzero()
        n = int(stop[0]) + 1 if len(stop) else 7  # compare up to and including the first </s>
        assert torch.equal(pred[b, :n], ids[b, :n])
        assert torch.all(ids[b, n:] == PAD), "positions after </s> must be padding"
        if attention:
            torch.testing.assert_close(weights[b, :n], w[b, :n])


def test_greedy_decode_pads_after_end_of_sequence():
    model = make(False)
    with torch.no_grad():  # make </s> the only likely token
        model.decoder.out.bias.fill_(0).index_fill_(0, torch.tensor([EOS]), 100.0)
    ids = model.greedy_decode(random_src([3, 2]), 4)
    assert ids.tolist() == [[EOS, PAD, PAD, PAD]] * 2


# ----- attention weights: rows sum to 1, padding gets nothing and changes nothing --------------------

@given(lengths=st.lists(st.integers(1, 7), min_size=1, max_size=4), T=st.integers(1, 5),
       seed=st.integers(0, 10_000))
def test_weights_rows_sum_to_one_and_skip_padding(lengths, T, seed):
    model = make(True, seed=seed % 7)
    src = random_src(lengths, seed=seed)
    _, weights = model(src, random_tgt(len(lengths), T, seed=seed))
    torch.testing.assert_close(weights.sum(-1), torch.ones(len(lengths), T, dtype=weights.dtype))
    assert torch.all(weights >= 0)
    padded = ~source_mask(src)[:, None, :].expand_as(weights)
    assert torch.all(weights[padded] == 0)


@both
@given(lengths=st.lists(st.integers(1, 6), min_size=2, max_size=4), seed=st.integers(0, 10_000))
def test_padding_changes_nothing(attention, lengths, seed):
    model = make(attention, seed=seed % 5)
    src = random_src(lengths, seed=seed)
    tgt_in = random_tgt(len(lengths), 4, seed=seed + 1)
    logits, weights = model(src, tgt_in)
    for b, n in enumerate(lengths):
        alone, w_alone = model(src[b:b + 1, :n], tgt_in[b:b + 1])  # the row without any padding
        torch.testing.assert_close(logits[b], alone[0])
        if attention:
            torch.testing.assert_close(weights[b, :, :n], w_alone[0])


@attentive
def test_masked_positions_are_ignored_by_the_decoder(read):
    model = make(read)
    src, tgt_in = random_src([5, 2]), random_tgt(2, 3)
    states, final = model.encoder(src)
    mask = source_mask(src)
    values = states if read == "states" else model.encoder.embed(src)
    dec = model.decoder

    def garbage(x):  # large values where the mask is False
        return x.masked_fill(~mask[..., None], 1e3)

    out = dec(tgt_in, dec.start(states, final, mask, values))[0]
    out2 = dec(tgt_in, dec.start(garbage(states), final, mask, garbage(values)))[0]
    torch.testing.assert_close(out, out2)
    unmasked = torch.ones_like(mask)
    out3 = dec(tgt_in, dec.start(garbage(states), final, unmasked, garbage(values)))[0]
    assert not torch.allclose(out, out3), "without the mask the padding must matter (the test can fail)"


def test_fixed_decoder_sees_the_source_only_through_the_context_vector():
    model = make(False)
    src, tgt_in = random_src([5, 3]), random_tgt(2, 4)
    states, final = model.encoder(src)
    mask = source_mask(src)
    dec = model.decoder
    out = dec(tgt_in, dec.start(states, final, mask))[0]
    out2 = dec(tgt_in, dec.start(torch.randn_like(states), final, mask))[0]
    torch.testing.assert_close(out, out2)
    out3 = dec(tgt_in, dec.start(states, final + 1.0, mask))[0]
    assert not torch.allclose(out, out3), "changing the context vector must change the output"


@attentive
def test_attention_decoder_uses_what_it_reads(read):
    model = make(read)
    src, tgt_in = random_src([5, 3]), random_tgt(2, 4)
    states, final = model.encoder(src)
    mask = source_mask(src)
    values = states if read == "states" else model.encoder.embed(src)
    dec = model.decoder
    out = dec(tgt_in, dec.start(states, final, mask, values))[0]
    out2 = dec(tgt_in, dec.start(states, final, mask, values + 1.0))[0]
    assert not torch.allclose(out, out2)


# ----- bad input gets a clear error ------------------------------------------------------------------

def test_source_mask():
    src = torch.tensor([[4, 5, 0], [6, 0, 0]])
    assert source_mask(src).tolist() == [[True, True, False], [True, False, False]]
    with pytest.raises(ValueError, match=r"rows \[1\] hold only padding"):
        source_mask(torch.tensor([[4, 5], [0, 0]]))
    with pytest.raises(ValueError, match=r"rows \[0\] have pad_id=0 before a real token"):
        source_mask(torch.tensor([[0, 5], [4, 0]]))


def test_errors_name_the_bad_input():
    model = make(True)
    src, tgt_in = random_src([3, 2]), random_tgt(2, 3)
    with pytest.raises(TypeError, match=r"^src must hold integer token ids of dtype torch.int64 \(torch.long\) or "
                                        r"torch.int32, the ones nn.Embedding takes, got dtype torch.float32$"):
        model(src.float(), tgt_in)
    with pytest.raises(ValueError, match=r"src must have shape \(B, L\) \(a batch of id sequences\), got \(3,?\)"):
        model(src[0], tgt_in)
    with pytest.raises(TypeError, match="src must be a torch.Tensor of token ids, got list"):
        model([[3, 4]], tgt_in)
    with pytest.raises(ValueError, match=rf"src holds token id {V} at position \(0, 1\), outside the vocabulary of "
                                         rf"size {V} \(valid ids are 0..{V - 1}\)"):
        model(torch.tensor([[3, V], [4, 0]]), tgt_in)
    with pytest.raises(ValueError, match=r"tgt_in holds token id -\d+ at position \(\d+, \d+\), outside"):
        model(src, tgt_in - 2)
    with pytest.raises(ValueError, match=r"src \(2, 3\) and tgt_in \(1, 3\) disagree on B"):
        model(src, tgt_in[:1])
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="max_len must be a positive int"):
            model.greedy_decode(src, bad)
    with pytest.raises(ValueError, match=r"tgt_in must hold at least one sequence of at least one token, got \(2, 0\)"):
        model(src, tgt_in[:, :0])


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8])
def test_ids_narrower_than_int32_are_refused(dtype):
    model = make(True)
    src, tgt_in = random_src([3, 2]), random_tgt(2, 3)
    with pytest.raises(TypeError, match=rf"^src must hold integer token ids .* got dtype {dtype}; convert them "
                                        rf"with src.long\(\)$"):
        model(src.to(dtype), tgt_in)
    with pytest.raises(TypeError, match=rf"^tgt_in must hold integer token ids .* got dtype {dtype}"):
        model(src, tgt_in.to(dtype))
    with pytest.raises(TypeError, match=rf"^src must hold integer token ids .* got dtype {dtype}"):
        model.greedy_decode(src.to(dtype), 4)
    assert torch.equal(model(src.int(), tgt_in.int())[0], model(src, tgt_in)[0])  # int32 and int64 both work


def test_special_ids_must_be_in_the_vocabulary():
    for pad in (-1, V, 2.0):
        with pytest.raises(ValueError, match=rf"^pad_id \(a token id\) must be an int in \[0, {V - 1}\], got {pad}$"):
            Encoder(V, EMB, HID, pad_id=pad)
    with pytest.raises(ValueError, match=rf"pad_id \(a token id\) must be an int in \[0, {V - 1}\], got -1"):
        Encoder(V, EMB, HID, pad_id=-1)  # not nn.Embedding's padding_idx=-1, the last row
    enc = Encoder(V, EMB, HID, bidirectional=True)
    dec = AttentionDecoder(11, EMB, 7, 2 * HID, 4)  # a target vocabulary of 11 tokens
    with pytest.raises(ValueError, match=r"bos_id \(a target token id\) must be an int in \[0, 10\], got 11"):
        Seq2Seq(enc, dec, bos_id=11)
    with pytest.raises(ValueError, match=r"eos_id \(a target token id\) must be an int in \[0, 10\], got -2"):
        Seq2Seq(enc, dec, eos_id=-2)
    assert Encoder(V, EMB, HID, pad_id=V - 1).embed.padding_idx == V - 1
    model = Seq2Seq(enc, dec, bos_id=10, eos_id=0)
    assert (model.bos_id, model.eos_id) == (10, 0) and model.greedy_decode(random_src([3, 2]), 2).shape == (2, 2)


def test_constructor_errors():
    with pytest.raises(ValueError, match="hidden_dim must be a positive int, got 0"):
        Encoder(V, EMB, 0)
    with pytest.raises(ValueError, match="context_dim must be a positive int, got 2.5"):
        Decoder(V, EMB, 7, 2.5)
    with pytest.raises(ValueError, match="attn_dim must be a positive int, got -1"):
        AttentionDecoder(V, EMB, 7, 10, -1)
    with pytest.raises(ValueError, match="value_dim must be a positive int, got 0"):
        AttentionDecoder(V, EMB, 7, 10, 4, value_dim=0)
    enc = Encoder(V, EMB, HID, bidirectional=True)
    with pytest.raises(ValueError, match=r"decoder expects encoder states of width 5, but the encoder gives 10"):
        Seq2Seq(enc, Decoder(V, EMB, 7, HID))
    dec = AttentionDecoder(V, EMB, 7, 2 * HID, 4)
    ok_mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"final must have shape \(B, E=10\), got \(2, 5\)"):
        dec.start(torch.zeros(2, 3, 10), torch.zeros(2, 5), ok_mask)
    with pytest.raises(ValueError, match=r"values must be \(B, S, 10\) for states \(2, 3, 10\), got \(2, 3, 6\)"):
        dec.start(torch.zeros(2, 3, 10), torch.zeros(2, 10), ok_mask, torch.zeros(2, 3, 6))
    with pytest.raises(ValueError, match=r"mask must be a boolean \(B, S\) = \(2, 3\) tensor, got \(2, 3\) "
                                         r"torch.int64"):
        dec.start(torch.zeros(2, 3, 10), torch.zeros(2, 10), ok_mask.long())
    with pytest.raises(ValueError, match="read must be 'states' or 'embeddings', got 'keys'"):
        Seq2Seq(enc, dec, read="keys")
    with pytest.raises(ValueError, match=r"read='embeddings' needs AttentionDecoder\(value_dim=6\).*got value_dim=10"):
        Seq2Seq(enc, dec, read="embeddings")
    with pytest.raises(ValueError, match="read='embeddings' needs an AttentionDecoder"):
        Seq2Seq(enc, Decoder(V, EMB, 7, 2 * HID), read="embeddings")
    with pytest.raises(ValueError, match="read='states' needs value_dim=10 .* got value_dim=6"):
        Seq2Seq(enc, AttentionDecoder(V, EMB, 7, 2 * HID, 4, value_dim=EMB))
