"""Small argument checks shared by the helpers, so bad input fails early with a clear message.

Every check names the argument at fault, shows what it got (value, shape or dtype) and says what
was expected. The helpers call them in one line, so each forward still reads like its equation.
"""

from __future__ import annotations

import numbers

import torch

# The index dtypes nn.Embedding accepts; narrower integers (int8, int16, uint8) make it fail deep inside torch.
TOKEN_ID_DTYPES = (torch.int64, torch.int32)


def shape_str(shape) -> str:
    """Format a shape as ``(2, 3, 4)`` for error messages."""
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def as_int(value, name: str, minimum: int | None = 1, maximum: int | None = None) -> int:
    """``value`` as a Python int if it is integer-like (int, numpy integer, 0-d integer tensor) in
    [minimum, maximum] (None: unbounded); the one integer rule of the helpers.

    bool, floats (even 4.0), strings and tensors that are not 0-d integers raise a ValueError.
    """
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point() \
            and not value.is_complex() and value.dtype != torch.bool:
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
            or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bound = {None: "an int", 0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
        if maximum is not None:
            bound = f"an int in [{'-inf' if minimum is None else minimum}, {maximum}]"
        got = f"a tensor of shape {shape_str(value.shape)} dtype {value.dtype}" \
            if isinstance(value, torch.Tensor) else repr(value)
        raise ValueError(f"{name} must be {bound}, got {got}")
    return int(value)


def positive_int(value, name: str) -> int:
    """``value`` as an int > 0 (integer-like scalars accepted), else a ValueError naming ``name``."""
    return as_int(value, name, minimum=1)


def positive_ints(**values) -> tuple[int, ...]:
    """Check several positive ints at once and return them as ints: ``T, w = positive_ints(T=T, window=w)``."""
    return tuple(positive_int(value, name) for name, value in values.items())


def as_real(value) -> float | None:
    """``value`` as a Python float if it is a real number (int, float, numpy scalar, 0-d real tensor), else None.

    The one number rule of the helpers, the companion of ``as_int``: bools are not numbers here.
    """
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype != torch.bool \
            and not value.is_complex():
        return float(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def require_real(value, name: str, low: float, high: float, bounds: str = "[]", what: str = "a number",
                 note: str = "") -> float:
    """``value`` as a float in the interval from low to high, else a ValueError naming ``name``; the one
    number rule of the helpers (dropout, eps, temperature, top_p, length penalty, smoothing, clipping).

    ``bounds``: "[]", "[)", "(]" or "()", whether each end is included; NaN is never in the interval.
    The message reads "{name} must be {what} in [low, high){note}, got {value!r}".
    """
    x = as_real(value)
    if x is None or not (low < x or bounds[0] == "[" and x == low) or not (x < high or bounds[1] == "]" and x == high):
        raise ValueError(f"{name} must be {what} in {bounds[0]}{low:g}, {high:g}{bounds[1]}{note}, got {value!r}")
    return x


def probability(value, name: str) -> float:
    """``value`` as a float in [0, 1) (a dropout rate); bools and non-numbers are rejected."""
    return require_real(value, name, 0, 1, "[)", "a probability")


def require_type(value, name: str, types, what: str) -> None:
    """Raise a TypeError unless ``value`` is an instance of ``types``; the message reads
    "{name} must be {what}, got {type name}" (the one type rule of the helpers)."""
    if not isinstance(value, types):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")


def require_tensor(x, name: str, *, floating: bool = False, min_dim: int = 0, dim: int | None = None,
                   last: int | None = None, what: str = "") -> None:
    """Raise TypeError/ValueError unless ``x`` is a tensor of the required kind and shape.

    ``dim``: exact number of dimensions; ``last``: required size of the last dimension; ``what``:
    the expected shape in words, e.g. "(B, T, C=16)", used in the message.
    """
    require_type(x, name, torch.Tensor, "a torch.Tensor")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dimensions, got shape {shape_str(x.shape)}"
        )
    if (dim is not None and x.dim() != dim) or (last is not None and (x.dim() == 0 or x.shape[-1] != last)):
        raise ValueError(f"{name} must have shape {what}, got {shape_str(x.shape)}")


def require_bool(value, name: str, meaning: str = "True or False") -> None:
    """Raise a TypeError unless ``value`` is a bool (1, 0 and numpy bools are refused); ``meaning`` says
    what each value means, e.g. "True (Pre-LN) or False (Post-LN)"."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be {meaning}, got {value!r}")


def require_choice(value, name: str, choices) -> None:
    """Raise a ValueError unless ``value`` is one of the strings ``choices``. A pair, given as a tuple, is
    written 'a' or 'b' in the message; any other collection as it prints (a list, a tuple)."""
    if not isinstance(value, str) or value not in choices:
        pair = isinstance(choices, tuple) and len(choices) == 2
        raise ValueError(f"{name} must be {' or '.join(map(repr, choices)) if pair else f'one of {choices}'}, "
                         f"got {value!r}")


def check_same_kind(names: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """Raise unless the three tensors, named together in ``names`` ("q, k and v"), share one dtype and one device."""
    if not a.dtype == b.dtype == c.dtype:
        raise TypeError(f"{names} must have the same dtype, got {a.dtype}, {b.dtype} and {c.dtype}")
    if not a.device == b.device == c.device:
        raise ValueError(f"{names} must be on the same device, got {a.device}, {b.device} and {c.device}")


def check_width_and_length(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise unless q (..., T, D) and k (..., S, D) have one width D, and k and v (..., S, Dv) one length S."""
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same width D: q is {shape_str(q.shape)} (D={q.shape[-1]}), "
                         f"k is {shape_str(k.shape)} (D={k.shape[-1]})")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length S: k is {shape_str(k.shape)}, v is {shape_str(v.shape)}")


def check_id_dtype(ids: torch.Tensor, name: str) -> None:
    """Raise a TypeError unless the tensor ``ids`` has a dtype nn.Embedding takes (int64 or int32) (lesson 01)."""
    if ids.dtype not in TOKEN_ID_DTYPES:  # int8, int16, uint8 crash inside nn.Embedding
        narrow = ids.dtype != torch.bool and not ids.is_floating_point() and not ids.is_complex()
        raise TypeError(f"{name} must hold integer token ids of dtype torch.int64 (torch.long) or torch.int32, "
                        f"the ones nn.Embedding takes, got dtype {ids.dtype}"
                        + (f"; convert them with {name}.long()" if narrow else ""))


def check_heads(d_model: int, n_heads: int, n_kv_heads: int | None = None) -> None:
    """Raise a ValueError unless d_model splits into n_heads heads of a whole number of features (lesson 04)
    and, given n_kv_heads, each key/value head serves a whole group of query heads (lesson 09). The one home
    of these rules: attention, the Transformer's and the GPT's configs, the attention-only model, the diagrams."""
    if d_model % n_heads != 0:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}: each head gets "
                         f"d_model / n_heads = {d_model / n_heads:g} features, which must be a whole number")
    if n_kv_heads is not None and n_heads % n_kv_heads != 0:
        raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}: every key/value "
                         "head must serve the same number of query heads")


def check_ids(ids, name: str, vocab_size: int, max_len: int | None = None, device: torch.device | None = None) -> None:
    """Raise a clear error unless ``ids`` is (B, L) int64/int32 token ids in [0, vocab_size), L <= max_len (lesson 08).

    ``device`` is the device of the model's embedding; the ids must be there too. Every model of the course
    (the RNN of lesson 01, the Transformer, MiniLM, the GPT, the attention-only model, the decoders of
    ``helpers.decoding``) checks its ids with this one function; None skips the length or device rule.
    """
    require_type(ids, name, torch.Tensor, "a torch.Tensor of token ids")
    check_id_dtype(ids, name)
    if device is not None and ids.device != device:
        raise ValueError(f"{name} is on {ids.device} but the model is on {device}: move the ids there with "
                         f"{name}.to({str(device)!r})")
    require_tensor(ids, name, dim=2, what="(B, L) (a batch of id sequences)")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one sequence of at least one token, got {shape_str(ids.shape)}")
    if max_len is not None and ids.shape[1] > max_len:
        raise ValueError(f"{name} has length {ids.shape[1]}, longer than the model's max_len={max_len}; "
                         "build the model with a larger max_len or shorten the input")
    bad = (ids < 0) | (ids >= vocab_size)
    if bad.any():
        where = tuple(bad.nonzero()[0].tolist())
        raise ValueError(f"{name} holds token id {ids[where].item()} at position {where}, outside the "
                         f"vocabulary of size {vocab_size} (valid ids are 0..{vocab_size - 1})")


def check_id_stream(ids, name: str, vocab_size: int | None = None, min_len: int = 2) -> None:
    """Raise a ValueError unless ``ids`` is a text as one stream of token ids (lesson 12): a 1-D integer tensor
    of at least ``min_len`` ids, each in [0, vocab_size) when vocab_size is given. The batches of
    ``check_ids`` are cut from such a stream."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool \
            or ids.numel() < min_len:
        got = f"{shape_str(ids.shape)} {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be a 1-D integer tensor of at least {min_len} token ids, got {got}")
    if vocab_size is not None:
        bad = (ids < 0) | (ids >= vocab_size)
        if bad.any():
            i = int(bad.nonzero()[0])
            raise ValueError(f"{name}[{i}] = {int(ids[i])} is not a token id of a vocabulary of size {vocab_size} "
                             f"(valid ids are 0..{vocab_size - 1})")


def check_qkv(q, k, v, mask=None, dropout_p: float = 0.0) -> None:
    """Check the arguments of one attention call: q (..., T, D), k (..., S, D), v (..., S, Dv) of one
    dtype and device, batch dimensions that broadcast, D >= 1, S >= 1; the mask; dropout_p in [0, 1)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(t, name, floating=True, min_dim=2)
    shapes = f"q {shape_str(q.shape)}, k {shape_str(k.shape)}, v {shape_str(v.shape)}"
    check_same_kind("q, k and v", q, k, v)
    check_width_and_length(q, k, v)
    if q.shape[-1] == 0 or k.shape[-2] == 0:
        raise ValueError(f"the width D and the key length S must be >= 1 (softmax over no keys is "
                         f"undefined): got {shapes}")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the batch dimensions (all but the last two) of q, k and v must broadcast: "
                         f"got {shapes}") from None
    probability(dropout_p, "dropout_p")
    if mask is not None:
        # The scores (..., T, S) take the batch dimensions of q and k only, so the mask may not add any
        # that only v has: torch.nn.functional.scaled_dot_product_attention refuses that mask too.
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        check_bool_mask(mask, (*batch, q.shape[-2], k.shape[-2]), device=q.device, like="q")


# One rule for masks, PyTorch's: the mask's axes are aligned with the scores' from the right.
MASK_RULE = ("a 2-D mask is (T, S), shared by every batch item and head; any other mask has as many axes "
             "as the scores; a key-padding mask on (B, H, T, S) scores is (B, 1, 1, S)")


def check_bool_mask(mask, target_shape, what: str = "(..., T, S)", device=None, like: str = "q") -> None:
    """Check that ``mask`` is boolean, broadcasts to ``target_shape`` without growing it (2-D, or with
    all the scores' axes: see MASK_RULE) and, when ``device`` is given, lies on the device of ``like``."""
    require_type(mask, "mask", torch.Tensor, "a boolean torch.Tensor")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be boolean with True = may attend, got dtype {mask.dtype}; "
            "convert an additive float mask with `mask == 0` or a 0/1 mask with `mask.bool()`"
        )
    target = torch.Size(target_shape)
    if 2 < mask.dim() < len(target):
        # aligned from the right, a (B, T, S) mask on (B, H, T, S) scores would put its B axis on the heads
        raise ValueError(
            f"a {mask.dim()}-D mask {shape_str(mask.shape)} on {len(target)}-D scores {what} = "
            f"{shape_str(target)} would be broadcast onto the wrong axes (a batch axis onto the heads): "
            f"{MASK_RULE}. Add the missing axes, e.g. mask[:, None] for (B, 1, T, S)"
        )
    try:
        ok = torch.broadcast_shapes(mask.shape, target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"mask of shape {shape_str(mask.shape)} does not broadcast to the attention "
            f"scores' shape {what} = {shape_str(target)}"
        )
    if device is not None and mask.device != torch.device(device):
        # masks are built on the CPU unless told otherwise (causal_mask(T) and padding_mask of a list)
        raise ValueError(
            f"mask is on {mask.device} but {like} is on {device}: build the mask there, e.g. "
            f"causal_mask(T, device={like}.device), or move it with mask.to({like}.device)"
        )
