"""The optimizer's pieces, written as their equations (chapter 9): AdamW and clipping the
gradient by its global norm.

These are reference versions, one tensor at a time, to read next to the chapter.
:func:`~minitransformer.training.train` uses PyTorch's ``torch.optim.AdamW`` and
``nn.utils.clip_grad_norm_``, which compute the same numbers (the tests compare them) with
"foreach" kernels that update every tensor of a group in one call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from minitransformer._checks import _type_name, check_number


class AdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay (Loshchilov and Hutter, 2019), one tensor at a time.

    For each parameter ``w`` with gradient ``g``, at step ``t = 1, 2, ...``::

        m = beta1 * m + (1 - beta1) * g           # running mean of the gradients
        v = beta2 * v + (1 - beta2) * g ** 2      # running mean of their squares
        m_hat = m / (1 - beta1 ** t)              # bias correction: m and v start at 0
        v_hat = v / (1 - beta2 ** t)
        w = w - lr * weight_decay * w             # decay, apart from the gradient
        w = w - lr * m_hat / (sqrt(v_hat) + eps)

    Equal to ``torch.optim.AdamW`` with the same arguments, whose defaults these are; its state
    has the same names (``step``, ``exp_avg``, ``exp_avg_sq``), so a ``state_dict`` of one
    loads into the other. Parameter groups and changing ``group["lr"]`` between steps work as
    in any PyTorch optimizer. No ``amsgrad``, ``maximize`` or sparse gradients.

    Raises:
        TypeError, ValueError: a bad ``lr``, ``betas``, ``eps`` or ``weight_decay`` (here), a
            sparse or complex gradient, or a gradient holding NaN or infinity (in :meth:`step`).
    """

    def __init__(self, params: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:
        check_number("lr", lr, low=0.0)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair of numbers, got {_type_name(betas)} "
                            f"({betas!r})")
        for name, beta in zip(("betas[0]", "betas[1]"), betas):
            if check_number(name, beta, low=0.0) >= 1:
                raise ValueError(f"{name} must be in [0, 1), got {beta!r}")
        check_number("eps", eps, low=0.0)
        check_number("weight_decay", weight_decay, low=0.0)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every parameter that has a gradient; ``closure`` recomputes the loss
        (optional, as in PyTorch) and its value is returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for w in group["params"]:
                if w.grad is not None:
                    self._update(w, group)
        return loss

    def _update(self, w: Tensor, group: dict) -> None:
        g = w.grad
        if g.is_sparse or g.is_complex():
            raise TypeError(f"AdamW takes dense real gradients, got a "
                            f"{'sparse' if g.is_sparse else 'complex'} one of shape "
                            f"{tuple(g.shape)}")
        if not torch.isfinite(g).all():
            raise ValueError(f"a gradient of shape {tuple(g.shape)} holds NaN or infinity: the "
                             f"update would make the weights NaN")
        lr, (beta1, beta2) = group["lr"], group["betas"]
        state = self.state[w]
        if not state:
            state["step"] = torch.tensor(0.0, device="cpu")    # as PyTorch's, on the CPU
            state["exp_avg"] = torch.zeros_like(w)
            state["exp_avg_sq"] = torch.zeros_like(w)
        state["step"] += 1
        t = state["step"].item()
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        m_hat = m / (1 - beta1 ** t)
        v_hat = v / (1 - beta2 ** t)
        w.mul_(1 - lr * group["weight_decay"])
        w.sub_(lr * m_hat / (v_hat.sqrt() + group["eps"]))


def clip_grad_norm(parameters: Tensor | Iterable[Tensor], max_norm: float) -> Tensor:
    """Scale all gradients together so that their global norm is at most ``max_norm``
    (Pascanu et al., 2013); returns the norm before clipping.

    The global norm is the length of all gradients laid end to end, the norm of the per-tensor
    norms: ``sqrt(sum_i ||g_i||^2)``. When it exceeds ``max_norm``, every gradient is multiplied
    by ``max_norm / (norm + 1e-6)``, so the update keeps its direction. Equal to
    ``nn.utils.clip_grad_norm_(parameters, max_norm)``; parameters without a gradient are
    skipped, and with none at all the norm is 0.

    Raises:
        TypeError: ``parameters`` not a tensor or an iterable of tensors, ``max_norm`` not a
            number.
        ValueError: ``max_norm`` not positive, or a global norm that is NaN or infinite
            (scaling would spread it to every gradient).
    """
    check_number("max_norm", max_norm, positive=True)
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    if isinstance(parameters, (str, bytes)) or not isinstance(parameters, Iterable):
        raise TypeError(f"parameters must be a tensor or an iterable of tensors, got "
                        f"{_type_name(parameters)}")
    parameters = list(parameters)
    for p in parameters:
        if not isinstance(p, Tensor):
            raise TypeError(f"parameters must hold tensors, got {_type_name(p)}")
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0, device=parameters[0].device if parameters else "cpu")
    device = grads[0].device
    norms = torch.stack([torch.linalg.vector_norm(g).to(device) for g in grads])
    total = torch.linalg.vector_norm(norms)                 # sqrt(sum_i ||g_i||^2)
    if not math.isfinite(total.item()):
        raise ValueError(f"the gradients' global norm is {total.item()}: a gradient holds NaN "
                         f"or infinity")
    scale = max_norm / (total + 1e-6)
    if scale < 1:
        for g in grads:
            g.mul_(scale.to(g.device))
    return total
