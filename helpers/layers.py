"""The layers every model of the course shares: the feed-forward net and the residual sub-layer (lesson 07).

The encoder-decoder (``helpers.transformer``), the GPT (``helpers.gpt``) and the pretrained MiniLM
(``helpers.pretrained``) all build their blocks from these two pieces.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from helpers._validate import positive_ints, probability, require_bool, require_choice, require_tensor

# The feed-forward activations a config may name; "gelu" is the exact erf form, not the tanh approximation.
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def check_activation(activation) -> str:
    """Raise a clear error unless ``activation`` names one of ``ACTIVATIONS`` (lesson 07)."""
    require_choice(activation, "activation", sorted(ACTIVATIONS))
    return activation


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 applied at every position alone (Vaswani et al. 2017, Eq. 2; lesson 07).

    ``activation="gelu"`` puts the exact GELU in place of max(0, .), as BERT and GPT-2 do (lessons 11, 12).
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        d_model, d_ff = positive_ints(d_model=d_model, d_ff=d_ff)
        dropout = probability(dropout, "dropout")
        self.d_model = d_model
        self.activation = ACTIVATIONS[check_activation(activation)]  # ReLU in the paper; GELU in BERT, GPT-2
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)  # on the hidden units, where nn.TransformerEncoderLayer puts it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C)."""
        require_tensor(x, "x", floating=True, min_dim=1, last=self.d_model, what=f"(B, T, C={self.d_model})")
        hidden = self.activation(self.linear1(x))  # (B, T, C) -> (B, T, d_ff)
        return self.linear2(self.dropout(hidden))  # (B, T, d_ff) -> (B, T, C)


class Residual:
    """A sub-layer's residual connection: where its LayerNorm and dropout sit around it (lesson 07).

    Pre-LN (``norm_first=True``): x + dropout(sublayer(norm(x))).
    Post-LN (``norm_first=False``, the 2017 paper, section 5.4): norm(x + dropout(sublayer(x))).
    Like The Annotated Transformer's ``SublayerConnection``, but the LayerNorm and the dropout stay
    the layer's own modules (``norm1``, ``dropout``, ...), so its state_dict and its printout keep
    their names: a layer makes one ``Residual(self.dropout, norm_first)`` and passes each norm in.
    """

    def __init__(self, dropout: nn.Module, norm_first: bool = True):
        require_bool(norm_first, "norm_first", "True (Pre-LN) or False (Post-LN)")
        self.dropout, self.norm_first = dropout, norm_first

    def __call__(self, x: torch.Tensor, sublayer, norm: nn.Module) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); sublayer and norm map (B, T, C) -> (B, T, C)."""
        if self.norm_first:
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))

    def __repr__(self) -> str:
        return f"Residual(norm_first={self.norm_first})"
