"""The command line: ``python -m minitransformer COMMAND`` (chapter 15).

A thin layer: argparse turns flags into the package's own objects and runs the package's own
code (the one training loop, :class:`~minitransformer.training.TrainingLoop`). This file is the
whole parser, every command and flag; each command is a module of its own (``prepare.py``,
``train.py``, ``generate.py``, ``convert.py``, ``finetune.py``, ``chat.py``, ``dpo.py``,
``serve.py``), and what they share (refusals, threads, devices, processes, checkpoints) is in
``common.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from minitransformer.cli import chat, convert, dpo, finetune, generate, prepare, serve, train
from minitransformer.cli.common import (
    PROG,
    CommandLineError,
    Parser,
    is_rank_zero,
    nonnegative,
    number,
    positive,
    seed,
)

__all__ = ["CommandLineError", "build_parser", "main"]


def build_parser() -> Parser:
    """The parser of every command."""
    parser = Parser(prog=PROG, description="Train a small GPT on your own text, sample "
                    "from it, fine-tune it on conversations and preferences, chat with it and "
                    "serve it (the course Transformers from scratch, chapters 15 to 18).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=Parser)
    p = commands.add_parser(
        "prepare", help="tokenize text once into a directory that train --data reads",
        description="Tokenize UTF-8 text files or directories, as a stream in bounded memory, "
        "into DATA_DIR: train.bin and val.bin (token ids, uint16 when the vocabulary fits, "
        "else uint32), the tokenizer files, and index.json. A run that is killed leaves a "
        "directory that train refuses and prepare may write again.")
    p.set_defaults(run=prepare.run)
    add = p.add_argument
    add("--data", metavar="PATH", nargs="+", required=True, help="UTF-8 text files, or "
        "directories read recursively in name order")
    add("--out", metavar="DATA_DIR", required=True, help="the directory to write (new or "
        "empty)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--vocab-size", type=positive, help="learn a BPE tokenizer of this "
                       f"many tokens from a seeded sample of the text (default "
                       f"{prepare.VOCAB_SIZE})")
    which.add_argument("--tokenizer", metavar="DIR", help="reuse a tokenizer: a directory "
                       "with vocab.json and merges.txt (ours, or GPT-2's own)")
    add("--val-fraction", type=number, default=0.1, help="the end of the text held out for "
        "the validation loss (default 0.1)")
    add("--workers", type=positive, help="encoding processes (default: the cores)")
    add("--seed", type=seed, default=0, help="seeds the tokenizer's sample (default 0)")
    add("--no-progress", action="store_true", help="no progress bar")

    t = commands.add_parser(
        "train", help="train a GPT on a UTF-8 text file",
        description="Train a byte-level BPE tokenizer and a GPT on a UTF-8 text file, saving "
        "checkpoints that --resume continues bit for bit. Under torchrun, every process "
        "trains on its slice of the same global batch (DistributedDataParallel).",
        epilog="Defaults for a new run: " + ", ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in train.DEFAULTS.items()) + ".")
    t.set_defaults(run=train.run)
    add = t.add_argument
    add("--data", metavar="FILE|DATA_DIR", help="UTF-8 text to train on, tokenized first into "
        "OUT/data (its last 10%% held out for the validation loss); or a directory made by "
        "prepare, read as memory maps")
    add("--out", metavar="DIR", required=True, help="the run's directory: transformers "
        "loads it (config.json, model.safetensors, tokenizer files)")
    add("--arch", choices=train.ARCHS, help="the model: GPT-2's (chapter 9) or Llama's "
        "(chapter 14)")
    add("--steps", type=positive, help="optimizer updates; with --resume, a larger number "
        "extends a run")
    add("--batch-size", type=positive, help="the global batch: sequences per update, over "
        "all processes and accumulation steps")
    add("--context-length", type=positive, help="tokens per sequence")
    add("--num-layers", type=positive, help="transformer blocks")
    add("--num-heads", type=positive, help="attention heads; must divide --d-model")
    add("--d-model", type=positive, help="width of every token vector")
    add("--vocab-size", type=positive, help="tokens of the BPE tokenizer, counting its 256 "
        "byte tokens and the 5 special tokens of the chat format that it reserves for "
        "finetune")
    add("--lr", type=number, help="peak learning rate")
    add("--schedule", choices=("cosine", "wsd"), help="the learning rate after the warm-up: "
        "a cosine decay to lr/10, or warm-up-stable-decay (lr, then a linear decay to lr/10 "
        "over the last fifth), which --resume --steps N extends bit for bit")
    add("--warmup-steps", type=positive, help="steps of linear warm-up (default: a tenth of "
        "--steps, 1 to 100)")
    add("--dropout", type=number, help="dropout probability (processes agree exactly only "
        "with 0)")
    add("--seed", type=seed, help="seeds the weights and the batches")
    add("--grad-accum", type=positive, help="micro-batches per update (same update as one "
        "batch that many times larger)")
    add("--save-every", type=positive, default=100, help="steps between checkpoints "
        "(default 100; the last step is always saved)")
    add("--eval-every", type=positive, default=50, help="steps between validation losses "
        "(default 50)")
    add("--resume", action="store_true", help="continue the run in --out from its last "
        "checkpoint")
    add("--device", help="cpu, cuda, cuda:1, ... (default: minitransformer.default_device())")
    add("--dtype", choices=tuple(train.DTYPES), help="the weights' precision")
    add("--threads", type=positive, help="CPU threads per process (default: OMP_NUM_THREADS, "
        "else the cores idle now; a resumed run keeps its count)")
    add("--no-progress", action="store_true", help="no progress bar")

    g = commands.add_parser("generate", help="continue a prompt with a trained model",
                            description="Print the prompt and its continuation.")
    g.set_defaults(run=generate.run)
    add = g.add_argument
    add("--model", metavar="DIR", required=True, help="a directory written by train")
    add("--prompt", required=True, help="the text to continue")
    add("--max-new-tokens", type=nonnegative, default=None,
        help="(default: 40, or as many as the model's context leaves after the prompt)")
    add("--temperature", type=number, default=1.0, help="0 is greedy (default 1.0)")
    add("--top-k", type=positive, help="sample among the k likeliest tokens only")
    add("--seed", type=seed, default=0, help="makes sampling repeatable (default 0)")
    add("--device", help="default: minitransformer.default_device()")

    f = commands.add_parser(
        "finetune", help="fine-tune a trained model on conversations (JSONL), in full or LoRA",
        description="Supervised fine-tuning on conversations, one {\"messages\": [{\"role\": "
        "..., \"content\": ...}, ...]} per line (TRL's and OpenAI's format): the loss counts "
        "the assistant's tokens and its end-of-turn token only. Checkpoints, --resume and "
        "torchrun work as for train.",
        epilog="Defaults for a new run: " + ", ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in finetune.DEFAULTS.items()) + ".")
    f.set_defaults(run=finetune.run)
    add = f.add_argument
    add("--model", metavar="DIR", help="a directory written by train (its tokenizer has the "
        "chat tokens)")
    add("--data", metavar="FILE", help="the conversations, JSON lines")
    add("--out", metavar="DIR", required=True, help="the run's directory: a model directory, "
        "or with --lora-rank a PEFT adapter")
    add("--steps", type=positive, help="optimizer updates")
    add("--lr", type=number, help="peak learning rate (cosine schedule)")
    add("--batch-size", type=positive, help="conversations per update, over all processes")
    add("--seed", type=seed, help="seeds the batches (and LoRA's A)")
    add("--lora-rank", type=positive, metavar="R", help="train a LoRA adapter of rank R "
        "instead of every weight")
    add("--lora-alpha", type=number, metavar="A", help="LoRA's scale is A / R (default A = R)")
    add("--lora-targets", nargs="+", metavar="NAME", help="the linear layers LoRA wraps "
        f"(default: {'; '.join(f'{k}: ' + ' '.join(v) for k, v in finetune.LORA_TARGETS.items())})")
    add("--merge", action="store_true", help="with --lora-rank: also write the merged model "
        "to DIR/merged/")
    add("--save-every", type=positive, default=100, help="steps between checkpoints "
        "(default 100; the last step is always saved)")
    add("--log-every", type=positive, default=10, help="steps between training losses "
        "printed (default 10)")
    add("--resume", action="store_true", help="continue the run in --out from its last "
        "checkpoint")
    add("--device", help="default: minitransformer.default_device()")
    add("--threads", type=positive, help="CPU threads per process (as for train)")
    add("--no-progress", action="store_true", help="no progress bar")

    d = commands.add_parser(
        "dpo", help="preference optimisation (DPO) on chosen/rejected pairs (JSONL)",
        description="Direct preference optimisation against a frozen copy of --model, on "
        "TRL's preference format: one {\"prompt\": ..., \"chosen\": ..., \"rejected\": "
        "...} per line, plain strings or lists of messages. Prints the loss (ln 2 = 0.6931 at "
        "the first step) and the reward accuracy; --out is a model directory transformers "
        "loads (with --lora-rank, the adapter merged). Checkpoints and --resume work as for "
        "finetune.",
        epilog="Defaults for a new run: " + ", ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in dpo.DEFAULTS.items()) + ".")
    d.set_defaults(run=dpo.run)
    add = d.add_argument
    add("--model", metavar="DIR", help="the starting policy and the reference: a directory "
        "written by train or finetune (its tokenizer has the chat tokens)")
    add("--data", metavar="FILE", help="the preference pairs, JSON lines")
    add("--out", metavar="DIR", required=True, help="the run's directory, a model directory")
    add("--beta", type=number, help="how strongly the policy is held near the reference (> 0)")
    add("--steps", type=positive, help="optimizer updates")
    add("--lr", type=number, help="peak learning rate (cosine schedule)")
    add("--batch-size", type=positive, help="preference pairs per update")
    add("--seed", type=seed, help="seeds the batches (and LoRA's A)")
    add("--lora-rank", type=positive, metavar="R", help="train a LoRA adapter of rank R "
        "(alpha = R, on finetune's default layers) instead of every weight")
    add("--save-every", type=positive, default=100, help="steps between checkpoints "
        "(default 100; the last step is always saved)")
    add("--log-every", type=positive, default=10, help="steps between the losses printed "
        "(default 10; the first step is always printed)")
    add("--resume", action="store_true", help="continue the run in --out from its last "
        "checkpoint")
    add("--device", help="default: minitransformer.default_device()")
    add("--threads", type=positive, help="CPU threads (as for train)")
    add("--no-progress", action="store_true", help="no progress bar")

    h = commands.add_parser("chat", help="talk with a fine-tuned model",
                            description="An interactive chat: each line of standard input is "
                            "a user turn (/exit or the end of input ends the chat); the reply "
                            "is streamed as it is generated, and the conversation is kept.")
    h.set_defaults(run=chat.run)
    add = h.add_argument
    add("--model", metavar="DIR", required=True, help="a model directory with the chat tokens "
        "(finetune's --out, its merged/, or a LoRA adapter it wrote)")
    add("--max-new-tokens", type=positive, default=100, help="the longest reply (default 100)")
    add("--temperature", type=number, default=0.0, help="0 is greedy (default 0)")
    add("--seed", type=seed, default=0, help="makes sampling repeatable (default 0)")
    add("--system", metavar="TEXT", help="a system message that begins the conversation")
    add("--device", help="default: minitransformer.default_device()")

    s = commands.add_parser(
        "serve", help="serve a model over HTTP, as OpenAI's API (chapter 18)",
        description="An OpenAI-compatible server: POST /v1/chat/completions (the chat "
        "template) and /v1/completions, streamed or not, GET /v1/models, and a chat page at "
        "/. Requests share every forward pass (continuous batching) and a paged KV cache. "
        "Needs the extra: pip install 'minitransformer[serve]'. SIGTERM or Ctrl+C finishes "
        "the answers in flight and exits.")
    s.set_defaults(run=serve.run)
    add = s.add_argument
    add("--model", metavar="DIR", required=True, help="a directory written by train or "
        "finetune (the chat endpoint needs the chat tokens)")
    add("--name", help="the model's id in the API (default: the directory's name)")
    add("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: "
        "this machine only)")
    add("--port", type=serve.port, default=8000, help="(default 8000; 0 picks a free one)")
    add("--max-batch", type=positive, default=16, help="requests decoded together (default "
        "16)")
    add("--kv-blocks", type=positive, default=256, help="blocks of 16 tokens in the KV "
        "cache's pool (default 256)")
    add("--no-pack-weights", action="store_true", help="do not keep a GPT's weights also "
        "packed for the CPU's matrix products (half the memory, slower batches)")
    add("--device", help="default: minitransformer.default_device()")
    add("--threads", type=positive, help="CPU threads (default: OMP_NUM_THREADS, else the "
        "cores idle now)")

    c = commands.add_parser("convert", help="pytorch_model.bin -> model.safetensors",
                            description="Write DIR/model.safetensors from DIR/pytorch_model.bin "
                            "(read with torch.load(weights_only=True), which runs no code "
                            "from the file); tied tensors are stored once, the .bin is kept.")
    c.set_defaults(run=convert.run)
    c.add_argument("dir", metavar="DIR", help="a directory with a pytorch_model.bin, or the "
                   "file itself")

    from minitransformer.cli import quantize
    quantize.add_arguments(commands.add_parser(
        "quantize", help="a Llama as a GGUF file in 8 or 4 bits, for llama.cpp (chapter 19)",
        description="Write MODEL (a GGUF file or a model directory) as a GGUF file whose "
        "matrices are of the type --to, its norms F32, with the tokenizer."))
    return parser


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
        return 2


def one_line(exc: BaseException) -> str:
    """The message of a refusal as one line starting with the program's name."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, FileNotFoundError) and exc.filename and exc.strerror:
        message = f"{exc.strerror}: {exc.filename}"
    return message if message.startswith(PROG) else f"{PROG}: error: {message}"
