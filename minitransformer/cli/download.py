"""``minitransformer download smollm2``: a pretrained model's file fetched into the cache
(:func:`minitransformer.pretrained.download_smollm2`), checked against its SHA-256, and its
path printed. The only command that reaches the network, and only when asked to."""

from __future__ import annotations

import argparse

from minitransformer.cli.common import CommandLineError

#: The models this command fetches: name -> the function of minitransformer.pretrained.
MODELS = {"smollm2": "download_smollm2"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Download a pretrained model's file into the cache (~/.cache/minitransformer), check "
        "its SHA-256, and print its path; a file already there and whole is not fetched "
        "again. smollm2: SmolLM2-135M-Instruct, GGUF, the model chat and generate use when "
        "no --model is given.")
    parser.add_argument("name", choices=tuple(MODELS), help="the model")


def run(args: argparse.Namespace) -> int:
    from minitransformer import pretrained

    fetch = getattr(pretrained, MODELS[args.name], None)
    if fetch is None:
        raise CommandLineError(f"download {args.name}: this version of minitransformer has no "
                               f"pretrained.{MODELS[args.name]}()")
    try:
        path = fetch()
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001  no network, a bad hash, a full disk: one line
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise CommandLineError(f"download {args.name} failed: {why}") from None
    print(path)
    return 0
