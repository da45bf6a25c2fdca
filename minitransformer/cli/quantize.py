"""``minitransformer quantize MODEL --to q8_0 --out FILE.gguf``: a Llama as a GGUF file that
llama.cpp runs (chapter 19), its matrices in 8 or 4 bits (or F16, F32) and its norms in F32.

MODEL is a GGUF file (SmolLM2's, or one this command wrote: requantised from the numbers it
stores) or a model directory (``train``'s, ``finetune``'s or a ``LlamaForCausalLM`` of
transformers'). The tokenizer goes with it when the source has one. The file is written under
``FILE.gguf.partial`` and renamed, so a kill leaves no half file under the name; an existing
``--out`` is kept and nothing is written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from minitransformer.cli.common import CommandLineError

TYPES = ("q8_0", "q4_0", "q4_1", "f16", "f32")
# general.* keys the new file states itself rather than copies
_OWN_KEYS = ("general.architecture", "general.file_type", "general.quantization_version",
             "general.alignment")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``quantize``."""
    parser.description = (
        "Write MODEL (a GGUF file or a model directory) as a GGUF file whose matrices are of "
        "the type --to, its norms F32, with the tokenizer.")
    add = parser.add_argument
    add("model", metavar="MODEL", help="a GGUF file of a Llama, or a model directory "
        "(config.json and model.safetensors: ours or transformers' LlamaForCausalLM)")
    add("--to", required=True, choices=TYPES, type=str.lower, help="the matrices' type: "
        "q8_0 (8.5 bits a weight), q4_1 (5), q4_0 (4.5), f16 or f32")
    add("--out", metavar="FILE.gguf", required=True, help="the file to write (must not exist)")


def run(args: argparse.Namespace) -> int:
    from minitransformer.bpe import BPETokenizer
    from minitransformer.gguf import GGUFFile, save_llama
    from minitransformer.llama import Llama

    source, out = Path(args.model), Path(args.out)
    if out.exists():
        raise CommandLineError(f"--out {out} exists already: it is kept, and nothing is "
                               f"written")
    if not out.parent.is_dir():
        raise CommandLineError(f"--out {out}: no directory {out.parent}")
    metadata: dict[str, object] = {}
    if source.is_file():
        file = GGUFFile(source)
        model = Llama.from_gguf(source)
        tokenizer = (BPETokenizer.from_gguf_metadata(file.metadata, source=str(source))
                     if "tokenizer.ggml.model" in file.metadata else None)
        metadata = {k: v for k, v in file.metadata.items()
                    if k.startswith("general.") and k not in _OWN_KEYS}
    elif source.is_dir():
        config = source / "config.json"
        if not config.is_file():
            raise CommandLineError(f"{source} is not a model directory: it has no config.json")
        from minitransformer import checkpoints
        model_type = checkpoints.read_json(config).get("model_type")
        if model_type != "llama":
            raise CommandLineError(f"{source} holds a {model_type!r} model; quantize writes "
                                   f"Llamas only (train --arch llama)")
        model = Llama.from_pretrained(source)
        has_tokenizer = any((source / name).is_file()
                            for name in ("tokenizer.json", "vocab.json"))
        tokenizer = BPETokenizer.from_pretrained(source) if has_tokenizer else None
        metadata = {"general.name": source.resolve().name}
    else:
        raise CommandLineError(f"{source}: no such file or directory")
    kind = args.to.upper()
    save_llama(model, out, type=kind, tokenizer=tokenizer, metadata=metadata)
    size, before = out.stat().st_size, sum(
        p.stat().st_size for p in ([source] if source.is_file() else source.iterdir())
        if p.is_file())
    with_tokenizer = "with its tokenizer" if tokenizer is not None else "no tokenizer"
    print(f"wrote {out}: {kind}, {len(GGUFFile(out).tensors)} tensors, {with_tokenizer}, "
          f"{size / 1e6:.1f} MB (the source: {before / 1e6:.1f} MB)")
    return 0
