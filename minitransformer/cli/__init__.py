"""The command line: ``python -m minitransformer COMMAND`` (chapter 15).

A thin layer: argparse turns flags into the package's own objects and runs the package's own
code (the one training loop, :class:`~minitransformer.training.TrainingLoop`). This file lists
every command; each command is a module of its own that declares its flags
(``add_arguments``) and runs (``run``), and what they share (refusals, the flag groups,
threads, devices, processes, checkpoints) is in ``common.py``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from minitransformer.cli import (
    chat,
    convert,
    download,
    dpo,
    finetune,
    generate,
    grpo,
    prepare,
    serve,
    train,
)
from minitransformer.cli import eval as evaluate
from minitransformer.cli import quantize
from minitransformer.cli.common import PROG, CommandLineError, Parser, is_rank_zero

__all__ = ["CommandLineError", "build_parser", "main"]

#: Every command: its name, its module, and the line ``--help`` shows.
COMMANDS = (
    ("prepare", prepare, "tokenize text once into a directory that train --data reads"),
    ("train", train, "train a GPT on a UTF-8 text file"),
    ("generate", generate, "continue a prompt with a trained model, or SmolLM2 (the default)"),
    ("finetune", finetune, "fine-tune a trained model on conversations (JSONL), in full or LoRA"),
    ("dpo", dpo, "preference optimisation (DPO) on chosen/rejected pairs (JSONL)"),
    ("grpo", grpo, "reinforcement learning (GRPO) from a reward function, on prompts (JSONL)"),
    ("chat", chat, "talk with a fine-tuned model, or SmolLM2 (the default)"),
    ("serve", serve, "serve a model over HTTP, as OpenAI's API (chapter 18)"),
    ("eval", evaluate, "score a model on HellaSwag, MMLU, GSM8K or a text (chapter 20)"),
    ("quantize", quantize, "a Llama as a GGUF file in 8 or 4 bits, for llama.cpp (chapter 19)"),
    ("convert", convert, "pytorch_model.bin -> model.safetensors"),
    ("download", download, "download a pretrained model into the cache"),
)


def build_parser() -> Parser:
    """The parser of every command: each module's ``add_arguments`` declares its flags."""
    parser = Parser(prog=PROG, description="Train a small GPT on your own text, sample "
                    "from it, fine-tune it on conversations and preferences, chat with it and "
                    "serve it (the course Transformers from scratch, chapters 15 to 18).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=Parser)
    for name, module, summary in COMMANDS:
        command = commands.add_parser(name, help=summary)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


#: Under torchrun, how long a rank other than 0 waits before it exits on a refusal: torchrun
#: stops every rank when one exits, so a rank leaving at once (on a busy machine, before rank
#: 0 has printed) would cut the one line a mistake is owed. Rank 0's exit ends the wait.
RANK_ZERO_GRACE_SECONDS = 10.0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); the exit status.

    Bad input prints one line on stderr, ``minitransformer: error: ...``, and returns 2; under
    torchrun rank 0 alone prints it.
    """
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except SystemExit as exc:       # --help
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        if is_rank_zero():
            print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (CommandLineError, ValueError, TypeError, OSError) as exc:
        if is_rank_zero():
            print(one_line(exc), file=sys.stderr)
        else:   # rank 0 prints: leaving first, we would have torchrun kill it before it does
            time.sleep(RANK_ZERO_GRACE_SECONDS)
        return 2


def one_line(exc: BaseException) -> str:
    """The message of a refusal as one line starting with the program's name."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, FileNotFoundError) and exc.filename and exc.strerror:
        message = f"{exc.strerror}: {exc.filename}"
    return message if message.startswith(PROG) else f"{PROG}: error: {message}"
