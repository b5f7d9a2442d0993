"""The finished pieces of *Attention, Step by Step*; each lesson derives one of them.

Shape letters used in every module, comment and lesson:

    B  batch                      T  target / query length      S  source / key length
    C  model width (d_model)      H  heads                      D  head width (C = H * D)
    V  vocabulary size

Importing this package has no side effects: it prints nothing, seeds nothing, downloads nothing.
Import the topic modules directly, e.g. ``from helpers.attention import MultiHeadAttention``.
"""

__version__ = "0.1.0"
