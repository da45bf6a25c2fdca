"""LoRA: a low-rank change learned beside each chosen linear layer (chapter 16).

A :class:`LoRALinear` keeps a linear layer's weight ``W`` frozen and learns two small matrices
(Hu et al., 2021)::

    h = W x + b + (alpha / r) · B A x        A: (r, in_features), B: (out_features, r)

``A`` starts random and ``B`` at zero, so a wrapped model starts exactly equal to its base.
Only ``A`` and ``B`` train; :meth:`LoRALinear.merge` folds ``(alpha / r) · B A`` into ``W``.

:func:`add_lora` wraps a model's layers by name, :func:`merge_lora` folds them all and gives
back plain ``nn.Linear`` layers. :func:`save_adapter` and :func:`load_adapter` write and read
PEFT's files (``adapter_config.json``, ``adapter_model.safetensors``) under transformers' module
names, taken from the model's checkpoint table (:data:`~minitransformer.llama.LLAMA_NAMES`,
:data:`~minitransformer.gpt.GPT2_NAMES`). GPT-2 stores the query, key and value projections as
one matrix, ``c_attn``, which PEFT gives a single ``A``; our separate ``q_proj``, ``k_proj``
and ``v_proj`` each have their own, so an adapter on them is refused in either direction.

:class:`AdapterSet` holds several adapters for one model and merges one at a time into its
weights, restoring the base exactly between them (chapter 18's server, ``serve --lora``).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor, nn

from minitransformer import _checks, pretrained
from minitransformer.gpt import GPT
from minitransformer.models import architecture_of

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
# PEFT's names: PeftModelForCausalLM.base_model (LoraModel).model (the transformers model)
_PEFT_PREFIX = "base_model.model."
#: The safetensors header key under which save_adapter records its base's kind and sizes.
BASE_METADATA = "minitransformer.base_model"
_BASE_FIELDS = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff")
_PEFT_TENSOR = re.compile(r"base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight")


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank change, ``(alpha / r) · B A``.

    Args:
        base: the linear layer to adapt; its weight and bias are frozen (``requires_grad``
            False) and used as they are, not copied.
        r: the rank of the change.
        alpha: the scale; the change is multiplied by ``alpha / r``.
        dropout: dropout on the LoRA branch's input, in training only (PEFT's
            ``lora_dropout``).
        device, dtype: where and in what precision to create ``A`` and ``B``; ``None`` means
            the base weight's. ``A`` and ``B`` must live on the base weight's device.

    Sub-modules (PEFT's names): ``base_layer``, ``lora_A`` ``(in -> r)``, ``lora_B``
    ``(r -> out)``, ``lora_dropout``. ``weight`` and ``bias`` are the base layer's.

    Raises:
        TypeError: ``base`` is not an ``nn.Linear`` (a ``LoRALinear`` is refused: wrapping
            twice), a size or scale of the wrong type.
        ValueError: ``r < 1`` or ``r > min(in_features, out_features)``, ``alpha <= 0``, a
            dropout outside ``[0, 1)``, another device.
    """

    def __init__(self, base: nn.Linear, r: int, *, alpha: float, dropout: float = 0.0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        if isinstance(base, LoRALinear):
            raise TypeError("base is already a LoRALinear: wrapping it again would add a "
                            "second low-rank change; merge it first (merge_lora)")
        _checks.check_type("base", base, nn.Linear, "an nn.Linear")
        self.r = _checks.check_int("r", r)
        _check_rank(self.r, base.in_features, base.out_features)
        self.alpha = _checks.check_number("alpha", alpha, positive=True)
        self.scaling = self.alpha / self.r
        factory = _checks.factory_kwargs(_base_device(base, device),
                                         base.weight.dtype if dtype is None else dtype)
        self.base_layer = base.requires_grad_(False)
        self.lora_dropout = nn.Dropout(_checks.check_probability("dropout", dropout))
        self.lora_A = nn.Linear(base.in_features, self.r, bias=False, **factory)
        self.lora_B = nn.Linear(self.r, base.out_features, bias=False, **factory)
        self.merged = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``A`` as PEFT starts it (Kaiming-uniform, ``a = sqrt(5)``: nn.Linear's default), ``B``
        zero: the change ``B A`` is zero, and the gradient reaches ``B`` through ``A x``."""
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    @property
    def weight(self) -> Tensor:
        """The base layer's weight ``(out_features, in_features)`` (with the change folded in
        after :meth:`merge`)."""
        return self.base_layer.weight

    @property
    def bias(self) -> Tensor | None:
        return self.base_layer.bias

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha:g}, merged={self.merged}"

    def forward(self, x: Tensor) -> Tensor:
        """``W x + b + (alpha / r) · B A x`` over the last dimension of ``x``; after
        :meth:`merge`, ``W`` holds the change and the base layer alone is used."""
        out = self.base_layer(x)
        if self.merged:
            return out
        x = self.lora_dropout(x.to(self.lora_A.weight.dtype))
        return out + (self.lora_B(self.lora_A(x)) * self.scaling).to(out.dtype)

    def delta_weight(self) -> Tensor:
        """The change to the weight, ``(alpha / r) · B A``, ``(out_features, in_features)``."""
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling

    def merge(self) -> None:
        """Fold the change into the base weight, ``W <- W + (alpha / r) · B A``: the output is
        the same (to rounding), with one matrix product instead of three.

        Raises:
            ValueError: already merged (the change would be added twice).
        """
        if self.merged:
            raise ValueError("this LoRALinear is already merged: merging again would add "
                             "(alpha / r) · B A to the weight twice")
        with torch.no_grad():
            self.base_layer.weight += self.delta_weight().to(self.weight.dtype)
        self.merged = True

    def unmerge(self) -> None:
        """Take the change back out of the base weight, ``W <- W - (alpha / r) · B A`` (equal
        to the weight before :meth:`merge` up to rounding).

        Raises:
            ValueError: not merged.
        """
        if not self.merged:
            raise ValueError("this LoRALinear is not merged: there is nothing to take out")
        with torch.no_grad():
            self.base_layer.weight -= self.delta_weight().to(self.weight.dtype)
        self.merged = False


def _check_rank(r: int, in_features: int, out_features: int, name: str = "the layer") -> None:
    """Refuse a rank above the layer's smaller side: ``B A`` cannot have a rank above
    ``min(in, out)``, so the extra rows and columns would only cost memory."""
    if r > min(in_features, out_features):
        raise ValueError(f"r={r} is more than the smaller side of {name} ({in_features} -> "
                         f"{out_features}): B A has rank at most {min(in_features, out_features)}"
                         f"; use r <= {min(in_features, out_features)}")


def _base_device(base: nn.Linear, device: torch.device | str | None) -> torch.device:
    """The base weight's device; a ``device`` given must be it (``"cuda"`` matches any index)."""
    here = base.weight.device
    if device is None:
        return here
    asked = torch.device(device)
    if asked.type != here.type or asked.index not in (None, here.index):
        raise ValueError(f"device={str(asked)!r}, but the base layer's weight is on {here}: "
                         f"A and B must be where the weight they change is")
    return here


# --- wrapping a model --------------------------------------------------------------------------

def add_lora(model: nn.Module, *, r: int, alpha: float,
             targets: str | Iterable[str] = ("q_proj", "v_proj"),
             dropout: float = 0.0) -> nn.Module:
    """Wrap ``model``'s linear layers named in ``targets`` in :class:`LoRALinear`, in place,
    and freeze every other parameter: afterwards only the ``lora_A`` and ``lora_B`` weights
    train. Returns ``model``. :func:`trainable_parameters` counts what trains.

    A target matches a layer whose name is it or ends in ``"." + target``, as PEFT's
    ``target_modules`` do: ``"q_proj"`` every layer's query projection,
    ``"layers.0.self_attn.q_proj"`` one of them. The names are our model's (Llama's
    ``out_proj`` is transformers' ``o_proj``).

    Raises:
        TypeError: ``model`` not an ``nn.Module``, a target not a string, ``r`` or ``alpha`` of
            the wrong type.
        ValueError: ``r < 1`` or above a target layer's smaller side, ``alpha <= 0``, a bad
            ``dropout``, no targets, a target that
            names no linear layer (the message lists those there are), a layer whose weight is
            tied to another parameter (merging would change both), or a model that already has
            LoRA layers.
    """
    _checks.check_type("model", model, nn.Module, "an nn.Module")
    r = _checks.check_int("r", r)
    alpha = _checks.check_number("alpha", alpha, positive=True)
    dropout = _checks.check_probability("dropout", dropout)
    _check_no_lora(model)
    names = _find_targets(model, _check_targets(targets))
    for name in names:
        layer = model.get_submodule(name)
        _check_rank(r, layer.in_features, layer.out_features, name)
    _wrap(model, names, r=r, alpha=alpha, dropout=dropout)
    return model


def _check_targets(targets: object) -> tuple[str, ...]:
    if isinstance(targets, str):
        targets = (targets,)
    if not isinstance(targets, Iterable):
        raise TypeError(f"targets must be layer names (strings), got {type(targets).__name__}")
    targets = tuple(targets)
    for target in targets:
        _checks.check_type("each target", target, str, "a layer name (a str)")
    if not targets:
        raise ValueError("targets is empty: name at least one linear layer, e.g. 'q_proj'")
    return targets


def _check_no_lora(model: nn.Module) -> None:
    layers = sorted(_lora_layers(model))
    if layers:
        raise ValueError(f"model already has LoRA layers ({', '.join(layers[:3])}"
                         f"{', ...' if len(layers) > 3 else ''}): wrapping twice would stack "
                         f"two changes; merge_lora(model) first")


def _lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def _find_targets(model: nn.Module, targets: tuple[str, ...]) -> list[str]:
    """The names of the linear layers the targets match, checked."""
    modules = dict(model.named_modules())
    linears = {name for name, m in modules.items() if isinstance(m, nn.Linear)}
    chosen: list[str] = []
    for target in targets:
        found = [n for n in modules if n == target or n.endswith("." + target)]
        if not found:
            leaves = sorted({n.rsplit(".", 1)[-1] for n in linears})
            raise ValueError(f"no layer of this {type(model).__name__} is called {target!r}"
                             f"{_their_name_hint(model, target)}; its linear layers are "
                             f"{', '.join(leaves)}")
        for name in found:
            if name not in linears:
                raise ValueError(f"target {target!r} names {name}, a "
                                 f"{type(modules[name]).__name__}, not a linear layer")
        chosen += [n for n in found if n not in chosen]
    tied = _tied_weights(model)
    for name in chosen:
        other = tied.get(id(modules[name].weight), [])
        others = [n for n in other if n != f"{name}.weight"]
        if others:
            raise ValueError(f"{name}.weight is tied to {others[0]}: merging a change into it "
                             f"would change both; leave {name} out of the targets")
    return chosen


def _tied_weights(model: nn.Module) -> dict[int, list[str]]:
    names: dict[int, list[str]] = defaultdict(list)
    for name, p in model.named_parameters(remove_duplicate=False):
        names[id(p)].append(name)
    return names


def _their_name_hint(model: nn.Module, target: str) -> str:
    """``" (transformers' o_proj is our out_proj)"`` when ``target`` is transformers' name."""
    try:
        table = _module_table(model)
    except TypeError:
        return ""
    ours = sorted({o.rsplit(".", 1)[-1] for o, (theirs, _) in table.items()
                   if theirs.rsplit(".", 1)[-1] == target})
    return f" (transformers' {target} is our {', '.join(ours)})" if ours else ""


def _wrap(model: nn.Module, names: Iterable[str], *, r: int, alpha: float,
          dropout: float) -> dict[str, LoRALinear]:
    """Freeze ``model`` and put a LoRALinear around each named linear layer."""
    model.requires_grad_(False)
    layers = {}
    for name in names:
        layers[name] = LoRALinear(model.get_submodule(name), r, alpha=alpha, dropout=dropout)
        model.set_submodule(name, layers[name])
    return layers


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)``: the numbers that train and all the model's numbers, a tied
    tensor counted once (PEFT's ``get_nb_trainable_parameters``)."""
    _checks.check_type("model", model, nn.Module, "an nn.Module")
    params = list(model.parameters())             # distinct tensors
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every LoRA layer into its weight and put the plain ``nn.Linear`` back, in place;
    every parameter trains again, as in a model fresh from its constructor. Returns ``model``,
    which ``save_pretrained`` then writes as an ordinary checkpoint.

    Raises:
        ValueError: the model has no LoRA layers.
    """
    _checks.check_type("model", model, nn.Module, "an nn.Module")
    layers = _lora_layers(model)
    if not layers:
        raise ValueError("model has no LoRA layers to merge (add_lora or load_adapter adds "
                         "them)")
    for name, layer in layers.items():
        if not layer.merged:
            layer.merge()
        model.set_submodule(name, layer.base_layer)
    return model.requires_grad_(True)


# --- PEFT's files ------------------------------------------------------------------------------

def _module_table(model: nn.Module) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each of our layers (module name) with transformers' name for it and the group of our
    layers stored in that one module (more than one: fused, as GPT-2's ``c_attn``). Read from
    the model's checkpoint table, so the names are those ``save_pretrained`` writes.

    Raises:
        TypeError: a model without a transformers counterpart (not a Llama or GPT).
    """
    architecture = architecture_of(model)   # PEFT's names are those of transformers' models
    table, prefix = architecture.names(model.config), architecture.prefix
    groups: dict[str, list[str]] = defaultdict(list)
    for ours, theirs in pretrained.their_names(table, model.config.num_layers).items():
        if ours.endswith(".weight"):
            groups[prefix + theirs.removesuffix(".weight")].append(ours.removesuffix(".weight"))
    return {ours: (theirs, tuple(group)) for theirs, group in groups.items() for ours in group}


def _fused(theirs: str, group: tuple[str, ...]) -> ValueError:
    leaves = ", ".join(g.rsplit(".", 1)[-1] for g in group)
    return ValueError(f"transformers stores our {leaves} as one layer, {theirs}, to which PEFT "
                      f"gives a single A shared by all {len(group)}; our layers each have an A "
                      f"of their own, so an adapter on them cannot be written or read as "
                      f"PEFT's exactly. Adapt the other layers, or merge (merge_lora, or PEFT's "
                      f"merge_and_unload) and save the whole model")


def peft_module_names(model: nn.Module) -> dict[str, str]:
    """Each LoRA layer of ``model`` and the name PEFT's files give it (transformers' module
    name): ``layers.0.self_attn.out_proj`` -> ``model.layers.0.self_attn.o_proj``.

    Raises:
        TypeError: ``model`` is not a Llama or GPT.
        ValueError: no LoRA layers, or one that PEFT's layout cannot express exactly (GPT's
            ``q_proj``, ``k_proj``, ``v_proj``: one fused ``c_attn`` in GPT-2).
    """
    table = _module_table(model)
    layers = _lora_layers(model)
    if not layers:
        raise ValueError("model has no LoRA layers (add_lora or load_adapter adds them)")
    names = {}
    for name in layers:
        if name not in table:
            raise ValueError(f"{name} has no counterpart in a transformers checkpoint")
        theirs, group = table[name]
        if len(group) > 1:
            raise _fused(theirs, group)
        names[name] = theirs
    return names


def _peft_targets(adapted: set[str], modules: Iterable[str]) -> list[str]:
    """The shortest ``target_modules`` suffixes that select exactly the ``adapted`` modules
    among ``modules`` under PEFT's rule (a name equal to the target or ending in ``.target``)."""
    def selected(suffix: str) -> set[str]:
        return {m for m in modules if m == suffix or m.endswith("." + suffix)}

    targets = set()
    for name in adapted:
        parts = name.split(".")
        suffixes = (".".join(parts[-k:]) for k in range(1, len(parts) + 1)
                    if not parts[-k].isdigit())          # "layers.1.x", not "1.x"
        targets.add(next(s for s in suffixes if selected(s) <= adapted))
    return sorted(targets)


def save_adapter(model: nn.Module, path: str | os.PathLike, *,
                 base_model_name_or_path: str) -> None:
    """Write ``model``'s LoRA layers as PEFT does: ``path/adapter_config.json`` (``r``,
    ``lora_alpha``, ``target_modules``, ...) and ``path/adapter_model.safetensors`` with
    ``A`` and ``B`` under PEFT's names, e.g.
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``. Then
    ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), path)`` computes
    the model's logits. ``base_model_name_or_path`` is where the base model is (the directory
    ``save_pretrained`` wrote, or a Hub id); it is recorded, not read.

    Raises:
        TypeError: ``model`` not a Llama or GPT, a path or name of the wrong type.
        ValueError: no LoRA layers, layers with different ``r``, ``alpha`` or dropout (one
            config holds one of each), a layer PEFT cannot express (see
            ``peft_module_names``), ``path`` is a file.
    """
    names = peft_module_names(model)
    _checks.check_type("base_model_name_or_path", base_model_name_or_path, str, "a str")
    folder = _check_folder(path)
    layers = _lora_layers(model)
    settings = {(layer.r, layer.alpha, layer.lora_dropout.p) for layer in layers.values()}
    if len(settings) > 1:
        raise ValueError(f"the LoRA layers differ in (r, alpha, dropout): {sorted(settings)}; "
                         f"PEFT's adapter_config.json holds one of each")
    r, alpha, dropout = settings.pop()
    tensors = {}
    for name, layer in layers.items():
        for part in ("A", "B"):
            weight = getattr(layer, f"lora_{part}").weight
            tensors[f"{_PEFT_PREFIX}{names[name]}.lora_{part}.weight"] = weight
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": r, "lora_alpha": int(alpha) if alpha.is_integer() else alpha,
        "lora_dropout": dropout,
        "target_modules": _peft_targets(set(names.values()),
                                        {t for t, _ in _module_table(model).values()}),
        "bias": "none", "fan_in_fan_out": isinstance(model, GPT),   # GPT-2's Conv1D: (in, out)
        "use_rslora": False, "use_dora": False, "lora_bias": False, "init_lora_weights": True,
        "inference_mode": True, "modules_to_save": None, "layers_to_transform": None,
        "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
    }
    pretrained.write_checkpoint(folder, config, tensors, weights_file=ADAPTER_WEIGHTS_FILE,
                                config_file=ADAPTER_CONFIG_FILE,
                                metadata={BASE_METADATA: json.dumps(_base_shape(model))})


def _base_shape(model: nn.Module) -> dict[str, object]:
    """What an adapter must match in its base: the model's kind and sizes (recorded in the
    adapter's safetensors header, which PEFT ignores)."""
    config = model.config
    return {"model": type(model).__name__,
            **{k: getattr(config, k) for k in _BASE_FIELDS if hasattr(config, k)}}


def _check_base(model: nn.Module, weights: Path) -> None:
    """Refuse a base whose kind or sizes differ from those the adapter was trained on (an
    adapter without them, PEFT's own, is read on the tensors' shapes alone)."""
    from safetensors import safe_open

    with safe_open(weights, "pt") as f:
        recorded = (f.metadata() or {}).get(BASE_METADATA)
    if recorded is None:
        return
    try:
        want = json.loads(recorded)
    except ValueError:
        raise ValueError(f"{weights}: its {BASE_METADATA} is not JSON (edited?)") from None
    have = _base_shape(model)
    differ = [k for k in want if k in have and want[k] != have[k]]
    if differ:
        raise ValueError(f"{weights} was trained on a base with "
                         + ", ".join(f"{k} {want[k]!r}" for k in differ) + "; this one has "
                         + ", ".join(f"{k} {have[k]!r}" for k in differ)
                         + ": load it into the model it was trained on")


def _check_folder(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file; an adapter is a directory holding "
                         f"{ADAPTER_CONFIG_FILE} and {ADAPTER_WEIGHTS_FILE}")
    return folder


# what our LoRALinear cannot express: PEFT's variants of LoRA, and extra trained modules
_UNSUPPORTED = {"use_rslora": "alpha / sqrt(r) scaling", "use_dora": "DoRA's magnitudes",
                "lora_bias": "a trained bias in B", "modules_to_save": "whole trained modules",
                "rank_pattern": "a rank per layer", "alpha_pattern": "an alpha per layer",
                "trainable_token_indices": "trained token embeddings",
                "target_parameters": "LoRA on parameters", "layer_replication": "copied layers",
                "alora_invocation_tokens": "activated LoRA", "use_qalora": "QALoRA"}


def load_adapter(model: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Read PEFT's adapter files (written by :func:`save_adapter` or by PEFT's
    ``save_pretrained``) into ``model``, in place: the layers named in
    ``adapter_model.safetensors`` are wrapped in :class:`LoRALinear` with the file's ``A`` and
    ``B``, and the rest frozen, as after :func:`add_lora`. Returns ``model``.

    Raises:
        TypeError: ``model`` not a Llama or GPT, ``path`` not a path.
        FileNotFoundError: no such directory or file (a pickled ``adapter_model.bin`` is not
            read).
        ValueError: the model already has LoRA layers; a file that is not JSON or
            safetensors; a config this LoRA cannot express (another ``peft_type`` or
            ``task_type``, ``use_rslora``, ``use_dora``, ``modules_to_save``, a bias, ...);
            a tensor name unknown to the model, on GPT-2's fused ``c_attn``, without its
            partner, or of the wrong shape (each named); a base of another kind or size
            (vocabulary, width, layers, heads) than the one :func:`save_adapter` recorded.
    """
    _module_table(model)
    _check_no_lora(model)
    r, alpha, dropout, pairs = _read_checked(model, path)
    layers = _wrap(model, pairs, r=r, alpha=alpha, dropout=dropout)
    with torch.no_grad():
        for name, (a, b) in pairs.items():
            layers[name].lora_A.weight.copy_(a)
            layers[name].lora_B.weight.copy_(b)
    return model


def _read_checked(model: nn.Module, path: str | os.PathLike
                  ) -> tuple[int, float, float, dict[str, tuple[Tensor, Tensor]]]:
    """``(r, lora_alpha, lora_dropout, {our layer: (A, B)})`` of the adapter at ``path``,
    every name, shape and the recorded base checked against ``model`` (see
    :func:`load_adapter`)."""
    table = _module_table(model)
    folder = _check_folder(path)
    config, tensors = _read_adapter(folder)
    _check_base(model, folder / ADAPTER_WEIGHTS_FILE)
    source = str(folder / ADAPTER_CONFIG_FILE)
    r, alpha, dropout = _adapter_settings(config, source)
    pairs = _adapter_tensors(tensors, table, str(folder / ADAPTER_WEIGHTS_FILE))
    modules = dict(model.named_modules())
    for name, (a, b) in pairs.items():
        layer = modules[name]
        want = {"A": (r, layer.in_features), "B": (layer.out_features, r)}
        for part, tensor in (("A", a), ("B", b)):
            if tuple(tensor.shape) != want[part]:
                raise ValueError(f"{folder / ADAPTER_WEIGHTS_FILE}: lora_{part} of "
                                 f"{table[name][0]} has shape {tuple(tensor.shape)}; r={r} and "
                                 f"our {name} ({layer.in_features} -> {layer.out_features}) "
                                 f"need {want[part]}")
    return r, alpha, dropout, pairs


def _read_adapter(folder: Path) -> tuple[dict, dict[str, Tensor]]:
    """``(adapter_config, tensors)``; a missing file is named, with a word on a pickled one."""
    if not folder.is_dir():
        raise FileNotFoundError(f"no such directory: {folder}")
    config_path, weights_path = folder / ADAPTER_CONFIG_FILE, folder / ADAPTER_WEIGHTS_FILE
    for file in (config_path, weights_path):
        if not file.is_file():
            hint = (" (adapter_model.bin holds the weights as a pickle, which this package "
                    "never loads: it can run code)") if (folder / "adapter_model.bin").exists() \
                else ""
            raise FileNotFoundError(f"{file} does not exist{hint}")
    return pretrained.read_checkpoint(folder, weights_file=ADAPTER_WEIGHTS_FILE,
                                      config_file=ADAPTER_CONFIG_FILE)


def _adapter_settings(config: dict, source: str) -> tuple[int, float, float]:
    """``(r, lora_alpha, lora_dropout)`` of a PEFT config, or a ValueError naming the field."""
    def refuse(why: str) -> ValueError:
        return ValueError(f"{source}: {why}, which LoRALinear cannot express (it adds "
                          f"(lora_alpha / r) · B A to a linear layer, nothing else)")

    if config.get("peft_type") != "LORA":
        raise refuse(f"peft_type is {config.get('peft_type')!r}, not 'LORA'")
    if config.get("task_type") not in (None, "CAUSAL_LM"):
        raise refuse(f"task_type is {config['task_type']!r}, not 'CAUSAL_LM'")
    if config.get("bias", "none") != "none":
        raise refuse(f"bias is {config['bias']!r} (trained biases)")
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise refuse(f"{key} is {config[key]!r} ({what})")
    try:
        return (_checks.check_int("r", config.get("r")),
                _checks.check_number("lora_alpha", config.get("lora_alpha"), positive=True),
                _checks.check_probability("lora_dropout", config.get("lora_dropout", 0.0)))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: {exc}") from None


def _adapter_tensors(tensors: dict[str, Tensor], table: dict[str, tuple[str, tuple[str, ...]]],
                     source: str) -> dict[str, tuple[Tensor, Tensor]]:
    """PEFT's tensors as ``{our layer: (A, B)}``, every name checked."""
    ours = {theirs: (name, group) for name, (theirs, group) in table.items()}
    parts: dict[str, dict[str, Tensor]] = defaultdict(dict)
    for key, tensor in tensors.items():
        match = _PEFT_TENSOR.fullmatch(key)
        if match is None:
            raise ValueError(f"{source} holds {key!r}, which is not a LoRA A or B weight "
                             f"(base_model.model.<module>.lora_A.weight)")
        theirs = match["module"]
        if theirs not in ours:
            raise ValueError(f"{source} holds {key!r}, but the model has no layer "
                             f"{theirs!r} (known: {', '.join(sorted(ours)[:4])}, ...)")
        name, group = ours[theirs]
        if len(group) > 1:
            raise _fused(theirs, group)
        parts[name][match["part"]] = tensor
    if not parts:
        raise ValueError(f"{source} holds no LoRA weights")
    for name, found in parts.items():
        if set(found) != {"A", "B"}:
            missing = ({"A", "B"} - set(found)).pop()
            raise ValueError(f"{source} has no lora_{missing} for {table[name][0]}")
    return {name: (found["A"], found["B"]) for name, found in parts.items()}


# --- several adapters over one model, one at a time (chapter 18's server) ------------------

class AdapterSet:
    """LoRA adapters for one model, of which one at a time is folded into its weights, as
    :func:`merge_lora` folds it: :meth:`activate` makes the model the base (``None``) or the
    base with one adapter's ``(alpha / r) · B A`` added, in place.

    The first time an adapter changes a layer, that layer's base weight is copied. A switch
    copies the base weights of the layers the old adapter changed back, exactly, and then adds
    the new adapter's change: the base is bit for bit the base again after any number of
    switches, and an adapter's weights are bit for bit those of :func:`merge_lora` on a fresh
    :func:`load_adapter` (taking a change out by subtracting it would round differently each
    time, and drift). The weights are changed through their tensors (their ``_version``
    counts it), so a fast decode step, packed or not, sees the change. It costs a copy of the
    adapted layers' base weights, each adapter's ``A`` and ``B``, and, at a switch, a matrix
    product per adapted layer.

    Args:
        model: a :class:`~minitransformer.gpt.GPT` or :class:`~minitransformer.llama.Llama`
            without LoRA layers.

    Raises:
        TypeError: not a GPT or Llama.
        ValueError: a model with LoRA layers.
    """

    def __init__(self, model: nn.Module):
        _module_table(model)
        _check_no_lora(model)
        self.model = model
        self.active: str | None = None                    # None: the base
        self.paths: dict[str, Path] = {}
        self._changes: dict[str, dict[str, tuple[Tensor, Tensor, float]]] = {}
        self._saved: dict[str, Tensor] = {}               # layer -> its base weight

    @property
    def names(self) -> tuple[str, ...]:
        """The adapters' names, in the order they were added."""
        return tuple(self._changes)

    def add(self, name: str, path: str | os.PathLike) -> None:
        """Read the adapter at ``path`` (PEFT's files, checked as :func:`load_adapter` checks
        them) under ``name``; the model's weights stay as they are.

        Raises:
            TypeError: a name or path of the wrong type.
            ValueError: an empty or taken name, an adapter :func:`load_adapter` refuses (for
                another base, another shape, ...), ``A`` or ``B`` holding NaN or infinity.
            FileNotFoundError: no adapter at ``path``.
        """
        if not _checks.check_type("name", name, str, "a str").strip():
            raise ValueError("the adapter's name is empty")
        if name in self._changes:
            raise ValueError(f"an adapter is called {name!r} already")
        r, alpha, _, pairs = _read_checked(self.model, path)
        modules = dict(self.model.named_modules())
        changes = {}
        for layer, (a, b) in pairs.items():
            weight = modules[layer].weight
            a, b = a.to(weight), b.to(weight)             # as LoRALinear holds them
            if not bool(torch.isfinite(a).all() and torch.isfinite(b).all()):
                raise ValueError(f"{path}: the A or B of {layer} holds NaN or infinity")
            changes[layer] = (a, b, alpha / r)
        for layer in changes:
            if layer not in self._saved:                   # not changed now: the base
                self._saved[layer] = modules[layer].weight.detach().clone()
        self._changes[name] = changes
        self.paths[name] = Path(path)

    def activate(self, name: str | None) -> None:
        """Make the model the base (``None``) or the base with adapter ``name`` merged.

        Raises:
            ValueError: no adapter of that name.
        """
        if name is not None and name not in self._changes:
            raise ValueError(f"no adapter is called {name!r}; there are "
                             f"{', '.join(map(repr, self._changes)) or 'none'}")
        if name == self.active:
            return
        modules = dict(self.model.named_modules())
        with torch.inference_mode(False), torch.no_grad():
            for layer in self._changes.get(self.active, ()):
                modules[layer].weight.copy_(self._saved[layer])
            for layer, (a, b, scaling) in self._changes.get(name, {}).items():
                weight = modules[layer].weight              # as LoRALinear.merge adds it
                weight += ((b @ a) * scaling).to(weight.dtype)
        self.active = name

    def __repr__(self) -> str:
        return f"AdapterSet({', '.join(self.names) or 'no adapters'}; active={self.active!r})"
