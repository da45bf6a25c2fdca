"""Running a module in eval mode for a while, then putting it back (shared by the package).

Generating, translating, evaluating and reading attention weights all want dropout off, and
must leave a model that was training still training afterwards, also when an error (a
``KeyboardInterrupt``, say) stops them halfway.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` in eval mode inside the ``with`` block, and back in the mode it was in
    afterwards, however the block ends."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)
