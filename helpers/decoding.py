"""Every decoding loop of the course, over one small model interface (lessons 01, 08, 09 and 12).

A model decodes through ``model.decode_step(ids, cache) -> logits (B, T, V)``: the logits of the
token ids ``ids`` (B, T) placed after the positions ``cache`` holds, unchecked (a loop checks its
input once, before it starts). The encoder-decoder (``helpers.transformer.Transformer``) also has
``encode(src)`` and ``new_decode_cache(memory, max_len=None, static=False, src_mask=None)``, whose
cache carries the encoder's memory; the GPT (``helpers.gpt.GPT``) has ``new_caches(batch, max_len)``,
one KV cache per block, and takes ``cache=None`` for a pass over the whole context. The RNN
(``helpers.rnn.Seq2Seq``) has ``new_decode_cache(src)``, a cache holding the decoder's state, which each
step advances past the ids it reads.

- ``greedy_decode_rnn`` (lesson 01): the RNN encoder-decoder;
- ``greedy_decode``, ``beam_search`` (lesson 08) and ``greedy_decode_cached`` with its CUDA-graph
  step (lesson 09): the encoder-decoder;
- ``filter_logits`` and ``generate``, the sampling loop behind ``GPT.generate`` (lesson 12).
"""

from __future__ import annotations

import math

import torch

from helpers._validate import as_int, check_ids, positive_int, require_bool, require_real, require_type, shape_str

# --- the RNN encoder-decoder (lesson 01) -------------------------------------------------------------


@torch.no_grad()
def greedy_decode_rnn(model, src: torch.Tensor, max_len: int, return_attention: bool = False):
    """Feed back the most likely token for max_len steps -> ids (B, max_len) [, weights (B, max_len, S)] (lesson 01).

    model is a ``helpers.rnn.Seq2Seq``: ``new_decode_cache(src)`` encodes src (B, S) and holds the
    decoder's state, and each ``decode_step`` reads one token and advances it. Every column is a
    generated token, and there are always max_len of them: no <s> column and no early stop, so
    lesson 01's plots can read one column per step. Positions after a row's first </s> are set to
    pad_id afterwards; the row keeps feeding back its own tokens, so the attention weights of those
    steps are the ones the model gives. Weights are None for the fixed-context decoder.

    It is not ``greedy_decode``'s loop: that loop feeds the whole prefix at every step to a cache
    holding the encoder's memory only (a Transformer re-reads it in one pass), feeds pad_id to
    finished rows and stops when all have finished, and checks the arguments of an encoder-decoder
    Transformer (its config and vocabularies); an RNN reads each token once, through its state.
    """
    max_len = positive_int(max_len, "max_len")
    cache = model.new_decode_cache(src)
    token = torch.full((src.shape[0], 1), model.bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    ids = []
    for _ in range(max_len):
        token = model.decode_step(token, cache).argmax(dim=-1)  # (B, 1, V) -> (B, 1)
        ids.append(token)
    ids = torch.cat(ids, dim=1)  # (B, max_len)
    is_eos = (ids == model.eos_id).long()  # (B, max_len)
    ids = ids.masked_fill(is_eos.cumsum(dim=1) - is_eos > 0, model.pad_id)  # after the first </s>
    if not return_attention:
        return ids
    weights = cache.weights  # max_len entries of (B, 1, S), or of None
    return ids, (None if weights[0] is None else torch.cat(weights, dim=1))  # (B, max_len, S)


# --- the encoder-decoder (lesson 08) -----------------------------------------------------------


def check_decode_args(model, src, bos_id, eos_id, max_len) -> tuple[int, int, int]:
    """Raise a clear error unless the arguments of a greedy or beam decoder are valid (lesson 08);
    return bos_id, eos_id and max_len as Python ints.

    model must be an encoder-decoder (``encode`` and ``decode_step``, as helpers.transformer.Transformer),
    src (B, S) its source token ids, bos_id and eos_id target token ids (bos_id not the pad id), and
    max_len an int in [2, model max_len]. Shared by every decoder.
    """
    if not (isinstance(model, torch.nn.Module) and hasattr(model, "encode") and hasattr(model, "decode_step")):
        raise TypeError(f"model must be a helpers.transformer.Transformer, got {type(model).__name__}")
    cfg = model.config
    check_ids(src, "src", cfg.src_vocab_size, cfg.max_len, model.encoder.embed.weight.device)
    bos_id, eos_id = (as_int(value, f"{name} (a target token id)", minimum=0, maximum=cfg.tgt_vocab_size - 1)
                      for name, value in (("bos_id", bos_id), ("eos_id", eos_id)))
    if bos_id == cfg.pad_id:
        raise ValueError(f"bos_id={bos_id} equals pad_id={cfg.pad_id}: the decoder would mask its own start token")
    max_len = as_int(max_len, "max_len (output length, BOS included, at most the model's max_len)", minimum=2,
                     maximum=cfg.max_len)
    return bos_id, eos_id, max_len


@torch.no_grad()
def greedy_decode(model, src: torch.Tensor, bos_id: int, eos_id: int, max_len: int) -> torch.Tensor:
    """Pick the most likely next token until every row has produced eos_id (lesson 08).

    Returns (B, L) ids with L <= max_len: column 0 is bos_id, and every position after a row's
    eos_id holds pad_id. (Lesson 01's RNN ``Seq2Seq.greedy_decode`` returns the generated tokens
    only, always max_len of them: no <s> column, no early stop.) The model runs in eval mode (no
    dropout) and its mode is restored after. The arguments are checked once, before the loop.
    """
    bos_id, eos_id, max_len = check_decode_args(model, src, bos_id, eos_id, max_len)
    was_training = model.training
    model.eval()
    try:
        memory, src_mask = model.encode(src)  # (B, S, C), (B, 1, 1, S)
        cache = model.new_decode_cache(memory, src_mask=src_mask)  # the memory only: each step reads all of ys
        B = src.shape[0]
        ys = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)  # (B,)
        for _ in range(max_len - 1):
            next_id = model.decode_step(ys, cache)[:, -1].argmax(dim=-1)  # (B, V) -> (B,)
            next_id = next_id.masked_fill(done, model.config.pad_id)  # finished rows get pad
            ys = torch.cat([ys, next_id[:, None]], dim=1)  # (B, t) -> (B, t + 1)
            done |= next_id == eos_id
            if done.all():
                break
        return ys
    finally:
        model.train(was_training)


def _length_penalty(length, alpha: float):
    """((5 + |Y|) / 6) ** alpha, the length normalisation of Wu et al. 2016, Eq. 14 (numbers or tensors)."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(model, src: torch.Tensor, bos_id: int, eos_id: int, max_len: int,
                beam_size: int = 4, length_penalty: float = 0.6) -> torch.Tensor:
    """Keep the beam_size most likely prefixes at every step; return the best one per example (lesson 08).

    The algorithm, for a batch at once (the k = beam_size beams of B sources are B * k decoder rows):
    1. One live beam <s> with log-probability 0 per source; the other k - 1 slots start at -inf.
    2. Each step extends every beam by every token, adding log P(token | prefix, src) to its score,
       and keeps the k best of the k * V candidates. A beam that has produced eos_id may only
       continue with pad_id, at no cost: it keeps its slot and its score.
    3. Stop when every beam has finished, or after max_len - 1 steps.
    4. Of each source's k beams, return the one with the best length-normalised score
       log P(Y | src) / ((5 + |Y|) / 6) ** alpha (Wu et al. 2016), |Y| = tokens after <s> up to
       and including eos_id (all of them for a beam cut off at max_len).
    Defaults are the 2017 paper's (section 6.1: k = 4, alpha = 0.6). beam_size=1 is greedy decoding.
    Returns (B, L) ids laid out like ``greedy_decode``'s: BOS first, pad_id after eos_id.
    """
    bos_id, eos_id, max_len = check_decode_args(model, src, bos_id, eos_id, max_len)
    beam_size = positive_int(beam_size, "beam_size")
    alpha = require_real(length_penalty, "length_penalty (alpha)", 0, math.inf, "[)", "a finite number")
    was_training = model.training
    model.eval()
    try:
        return _beam_search(model, src, bos_id, eos_id, max_len, beam_size, alpha)
    finally:
        model.train(was_training)


def _beam_search(model, src, bos_id, eos_id, max_len, k, alpha) -> torch.Tensor:
    B, device, pad_id = src.shape[0], src.device, model.config.pad_id
    memory, src_mask = model.encode(src)  # (B, S, C), (B, 1, 1, S)
    cache = model.new_decode_cache(memory.repeat_interleave(k, 0), src_mask=src_mask.repeat_interleave(k, 0))
    ys = torch.full((B * k, 1), bos_id, dtype=torch.long, device=device)  # (B * k, 1)
    scores = torch.full((B, k), -math.inf, dtype=torch.float64, device=device)  # (B, k) summed log-probs
    scores[:, 0] = 0.0  # one live beam per source, or the k beams would be k copies of one
    done = torch.zeros(B * k, dtype=torch.bool, device=device)  # (B * k,) has produced eos_id
    lengths = torch.zeros(B * k, dtype=torch.long, device=device)  # (B * k,) tokens after <s>, eos included
    rows_of = torch.arange(B, device=device)[:, None] * k  # (B, 1): first decoder row of each source
    for _ in range(max_len - 1):
        log_probs = torch.log_softmax(model.decode_step(ys, cache)[:, -1].double(), dim=-1)  # (B * k, V)
        V = log_probs.shape[-1]
        pad_only = torch.full_like(log_probs[0], -math.inf)  # (V,): a finished beam continues with pad, free
        pad_only[pad_id] = 0.0
        log_probs = torch.where(done[:, None], pad_only, log_probs)  # (B * k, V)
        total = (scores[:, :, None] + log_probs.view(B, k, V)).view(B, k * V)  # (B, k, V) -> (B, k * V)
        scores, flat = total.topk(k, dim=-1)  # (B, k): the k best candidates of each source
        rows = (rows_of + flat // V).flatten()  # (B * k,): the beam each candidate extends
        token = (flat % V).flatten()  # (B * k,): with which token
        ys = torch.cat([ys[rows], token[:, None]], dim=1)  # (B * k, t + 1)
        lengths = lengths[rows] + (~done[rows]).long()  # a live beam grows by one token
        done = done[rows] | (token == eos_id)
        if done.all():
            break
    normalised = scores / _length_penalty(lengths.view(B, k).double(), alpha)  # (B, k)
    best = normalised.argmax(dim=-1)  # (B,)
    pick = torch.arange(B, device=device) * k + best  # (B,): the decoder row of each source's best beam
    width = 1 + int(lengths[pick].max())  # <s> + the longest returned hypothesis; the rest is padding
    return ys[pick, :width]  # (B, L)


# --- greedy decoding with a KV cache (lesson 09) -------------------------------------------------------
#
# One decoding step must have the same shapes at every step, so that a GPU can replay it as a
# recorded CUDA graph (one launch for the step's few dozen kernels) and the host never has to
# wait for the device: the cache is preallocated at its full length, the position to write is a
# tensor on the device, and the new query attends to all max_len slots with a mask that keeps
# the slots filled so far (a static DecoderCache). On the CPU the same step runs as plain Python.


def _greedy_step(model, cache, ys, token, done, eos_id: int):
    """The whole one-token step of greedy decoding as a function of preallocated tensors only.

    Reads the newest token from ``token`` (B, 1), runs it through ``model.decode_step`` with a static
    cache, writes the next token into ``token`` and into column ``t + 1`` of ``ys`` (B, max_len), t
    the token's slot, and updates ``done`` (B,): all in place, so that a CUDA graph recorded from
    one call replays every later step.
    """
    pad_id = model.config.pad_id
    slot = cache.self_attn[0].position  # 0-d tensor on the device: the slot the next token goes to

    def step():
        logits = model.decode_step(token, cache)[:, -1]  # (B, 1, V) -> (B, V)
        next_id = logits.argmax(dim=-1).masked_fill(done, pad_id)  # (B,): finished rows get pad, as in greedy_decode
        ys.index_copy_(1, slot.view(1), next_id[:, None])  # the slot has advanced: column t + 1
        done.logical_or_(next_id == eos_id)
        token.copy_(next_id[:, None])
    return step


def _graphed(step, device, warmup: int = 2):
    """(first, then): ``first`` runs ``warmup`` steps eagerly, ``then`` replays one step as a CUDA graph.

    Eager warm-up steps on a side stream come first, as the CUDA graph documentation asks
    (libraries allocate their workspaces there, not inside the capture); they are real steps.
    Capturing only records the kernels: the recorded step runs at the first replay.
    """
    graph = torch.cuda.CUDAGraph()

    def first(n: int) -> int:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(min(n, warmup)):
                step()
        torch.cuda.current_stream(device).wait_stream(stream)
        with torch.cuda.graph(graph):
            step()
        return min(n, warmup)

    return first, graph.replay


@torch.no_grad()
def greedy_decode_cached(model, src: torch.Tensor, bos_id: int, eos_id: int, max_len: int,
                         cuda_graph: bool | None = None, check_every: int = 16) -> torch.Tensor:
    """greedy_decode with a KV cache: the same ids, one new position per step (lesson 09).

    Each step runs the decoder on the newest token only; keys and values of the earlier positions
    come from the cache, and the cross-attention's keys and values of the memory are projected
    once. The arguments are checked once; the step never waits for the device; whether every row
    has finished is read every ``check_every`` steps, and the steps after that only write pads,
    which are cut off. On CUDA (``cuda_graph`` None or True) the step is recorded once as a CUDA
    graph and replayed; elsewhere the same step runs eagerly. Returns (B, L) ids laid out
    exactly as greedy_decode's.
    """
    bos_id, eos_id, max_len = check_decode_args(model, src, bos_id, eos_id, max_len)
    check_every = positive_int(check_every, "check_every")
    device = src.device
    if cuda_graph is None:
        cuda_graph = device.type == "cuda"
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs a CUDA device, got src on {device}")
    pad_id = model.config.pad_id
    was_training = model.training
    model.eval()
    try:
        memory, src_mask = model.encode(src)  # (B, S, C), (B, 1, 1, S)
        B = src.shape[0]
        # A mask that keeps everything changes nothing but costs time at every step: drop it.
        memory_mask = None if bool(src_mask.all()) else src_mask  # (B, 1, 1, S) or None; read once
        cache = model.new_decode_cache(memory, max_len, static=True, src_mask=memory_mask)
        ys = torch.full((B, max_len), pad_id, dtype=torch.long, device=device)  # (B, max_len)
        ys[:, 0] = bos_id
        token = ys[:, :1].clone()  # (B, 1): the newest token, an input buffer of the step
        done = torch.zeros(B, dtype=torch.bool, device=device)  # (B,)
        step = _greedy_step(model, cache, ys, token, done, eos_id)
        n_steps, ran = max_len - 1, 0
        if cuda_graph and n_steps > 2:  # two eager warm-up steps, then the graph
            first, step = _graphed(step, device, warmup=2)
            ran = first(n_steps)
        while ran < n_steps:
            step()
            ran += 1
            if ran % check_every == 0 and bool(done.all()):  # the only read from the device in the loop
                break
        # greedy_decode stops after the step at which the last row finished: cut there
        body = ys[:, 1:ran + 1]  # (B, ran)
        finished = (body == eos_id).any(dim=1)  # (B,)
        first_eos = (body == eos_id).int().argmax(dim=1)  # (B,): column of the first eos (0 if none)
        L = 1 + int(torch.where(finished, first_eos + 1, torch.full_like(first_eos, ran)).max())
        return ys[:, :L]
    finally:
        model.train(was_training)


# --- sampling from a GPT (lesson 12) ---------------------------------------------------------------


def _probabilities(x: torch.Tensor) -> torch.Tensor:
    """softmax(x) in float64, where a row holding +inf puts all its probability, evenly, on its +inf entries."""
    x = x.double()
    top = torch.isposinf(x)  # (..., V)
    has_inf = top.any(dim=-1, keepdim=True)  # (..., 1)
    finite = torch.softmax(x.masked_fill(has_inf, 0.0), dim=-1)  # the +inf rows are recomputed below
    return torch.where(has_inf, top.double() / top.sum(dim=-1, keepdim=True).clamp(min=1), finite)


def filter_logits(logits: torch.Tensor, temperature: float = 1.0, top_k=None, top_p=None) -> torch.Tensor:
    """logits / temperature with the entries outside top-k, then outside top-p, set to -inf (lesson 12).

    top_k keeps the k largest (ties broken as ``torch.topk`` does). top_p keeps the smallest set of
    most probable tokens whose probability reaches top_p: a token is kept while the tokens before it
    (sorted by probability, largest first) sum to less than top_p, so the token that crosses top_p is
    kept and so is the most probable one. top_p=1.0 keeps all. The division runs in float32 at
    least (half-precision logits over a small temperature would overflow to inf); a +inf logit
    holds all the probability of its row, so top-p keeps it; NaN logits are refused.
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() < 1 \
            or logits.shape[-1] == 0:
        got = f"{shape_str(logits.shape)} {logits.dtype}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a floating tensor (..., V) with V >= 1, got {got}")
    t = require_real(temperature, "temperature", 0, math.inf, "()", "a positive finite number",
                     " (1.0 = unchanged; use top_k=1 for greedy)")
    nan = torch.isnan(logits)
    if nan.any():
        where = tuple(nan.nonzero()[0].tolist())
        raise ValueError(f"logits hold NaN (first at index {where} of {shape_str(logits.shape)}): a model that "
                         "outputs NaN has no distribution to sample from")
    x = logits.to(torch.promote_types(logits.dtype, torch.float32)) / t
    if top_k is not None:
        top_k = min(positive_int(top_k, "top_k"), x.shape[-1])
        keep = torch.zeros_like(x, dtype=torch.bool).scatter_(-1, x.topk(top_k, dim=-1).indices, True)
        x = x.masked_fill(~keep, float("-inf"))
    if top_p is not None:
        p = require_real(top_p, "top_p", 0, 1, "(]", "a probability")
        if p < 1.0:
            probs = _probabilities(x)  # (..., V); float64 so the running sum is exact enough
            sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # (..., V)
            before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of the tokens ranked above
            keep_sorted = before < p
            keep_sorted[..., 0] = True  # the most probable token always stays
            keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
            x = x.masked_fill(~keep, float("-inf"))
    return x


@torch.no_grad()
def generate(model, ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k=None, top_p=None,
             generator=None, use_cache: bool = True) -> torch.Tensor:
    """Sample max_new_tokens after ids (B, T) -> (B, T + max_new_tokens); top_k=1 is greedy (lesson 12).

    Each step draws one ``torch.multinomial(..., generator=generator)`` for the whole batch from
    ``softmax(filter_logits(...))``, after the ids in ``model.config.special_ids`` are removed (a
    language model never writes <pad>, <s> or </s> into its text). The model sees at most its
    ``max_len`` latest tokens (nanoGPT's crop), so it can write past max_len. With ``use_cache``
    the keys and values of earlier positions are kept (one KV cache per block) and each step runs
    the model on the newest token only; once the context window slides, the learned positions of
    every token change, so the caches are rebuilt from the cropped context at each later step.
    """
    cfg = model.config
    check_ids(ids, "ids", cfg.vocab_size, cfg.max_len, model.embed.weight.device)
    max_new_tokens = as_int(max_new_tokens, "max_new_tokens", minimum=0)
    require_bool(use_cache, "use_cache")
    require_type(generator, "generator", (torch.Generator, type(None)), "a torch.Generator or None")
    filter_logits(torch.zeros(1, cfg.vocab_size), temperature, top_k, top_p)  # check the knobs once
    special = list(cfg.special_ids)
    window = min(ids.shape[1] + max_new_tokens, cfg.max_len)  # the most tokens the model sees at once
    was_training = model.training
    model.eval()
    try:
        out, caches = ids, None
        for _ in range(max_new_tokens):
            context = out[:, -cfg.max_len:]  # (B, <= max_len): the crop
            if not use_cache:
                logits = model.decode_step(context, None)[:, -1]  # (B, T, V) -> (B, V): the whole context again
            elif caches is None or caches[0].length == window:  # first step, or the window slid: refill
                caches = model.new_caches(ids.shape[0], window)
                logits = model.decode_step(context, caches)[:, -1]  # (B, V)
            else:
                logits = model.decode_step(out[:, -1:], caches)[:, -1]  # the newest token only
            logits[:, special] = float("-inf")  # never sampled
            probs = torch.softmax(filter_logits(logits, temperature, top_k, top_p).float(), dim=-1)  # (B, V)
            token = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
            out = torch.cat([out, token.to(out.dtype)], dim=1)  # (B, t + 1)
    finally:
        model.train(was_training)
    return out
