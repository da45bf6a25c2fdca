"""minitransformer: the companion package of the course *Transformers from scratch*.

Each module holds one idea of the book and names the chapter that explains it. Everything a
chapter uses is re-exported here, so a chapter writes ``from minitransformer import one_hot``.
"""

from minitransformer.attention import softmax
from minitransformer.device import default_device
from minitransformer.plot import heatmap
from minitransformer.vocab import Vocabulary, one_hot, tokenize

__all__ = [
    "Vocabulary",
    "default_device",
    "heatmap",
    "one_hot",
    "softmax",
    "tokenize",
]
