"""Continuous batching: one engine that serves many requests at once (chapter 18; Yu et al.,
2022, Orca).

Static batching starts a batch and waits for its longest answer: a request that ends early
leaves its row idle, and a new request waits for the whole batch. The :class:`Engine` instead
decides again at every step which requests run. A step:

1. gives back the blocks of cancelled requests;
2. admits waiting requests, oldest first, while fewer than ``max_batch`` run and the free blocks
   hold the new request's tokens (plus one) after the running requests have taken the block
   their next token may need;
3. *prefills* each admitted request alone: its prompt in one forward pass, which writes its
   keys and values into its blocks and gives its first token;
4. *decodes* every other running request in one batched forward pass: one new token per row,
   the rows left-padded to the longest (:class:`~minitransformer.paged_cache.PagedView`);
5. ends the requests that wrote an end token, a stop string, or ``max_tokens`` tokens, and
   frees their blocks, so that the next step admits waiting ones in their place.

Prefill and decode thus share a step, in separate forward passes: a prompt of hundreds of
tokens would otherwise pad every one-token decode row to its length. A new request's prefill
runs alone (TTFT is one prefill after admission); on the CPU a prefill is already a large
matrix product, and batching prefills buys little.

A GPT or a Llama runs both through its ``make_fast_decode_step``'s step
(:meth:`GPT.make_fast_decode_step <minitransformer.gpt.GPT.make_fast_decode_step>`) with
``pack_weights=True``: its weights packed once, when the engine is made, in oneDNN's layout,
which multiplied GPT-2 small's matrices by 3 to 16 rows in 0.6-0.9 of the time of the
unpacked blocks; one or two rows take the blocks of weight rows, which both threads share.
That costs the weights once more in memory, and makes the first token equal to the one it gets
alone up to float rounding rather than bit for bit. ``pack_weights=False`` prefills with
``make_decode_step``'s step (bit for bit ``forward``) and decodes with the unpacked fast step.

The keys and values live in a :class:`~minitransformer.paged_cache.BlockPool`. A request takes
a block each time its last one fills. When the pool is empty, the youngest running request is
*preempted*: its blocks are freed and it goes back to the front of the queue with the tokens it
has written; when it is admitted again, its prompt and tokens are prefilled again
(recomputation, as vLLM does), and it continues where it stopped. No request fails, and none
writes into another's blocks. With ``prefix_caching=True``, requests whose tokens begin the same
way share the full blocks of that beginning, held by reference count, and each prefills only
the rest. A full block keeps its keys after its last user ends, evictable, until the pool needs
it (the least recently used first): a request that comes after the first has ended still finds
them (vLLM's automatic prefix caching).

Each request samples with its own generator (``seed``) and counts its own tokens for the
penalties, so its tokens are those it gets alone with
:func:`~minitransformer.generation.generate` (greedy or seeded), up to float rounding: a row of
a batched matrix product, or the fast step's blocks, may round differently from the same row
alone (chapter 18 measures whether that ever changes a token).

With ``adapters`` (an :class:`~minitransformer.lora.AdapterSet`), each request names a LoRA
adapter or the base, and the engine serves *one adapter at a time*, merged into the weights, so
a step costs what it costs without LoRA. Admission stays first come, first served: while the
oldest waiting request wants the adapter merged now, requests are admitted as before; when it
wants another, admission stops (the requests behind it wait too, so none is passed over and
none starves), the running requests finish, and the weights switch (the base weights copied
back exactly, the new adapter's ``B A`` added). The cost: a stream that alternates between
adapters runs in small batches, each drained before the next switch. The other design, vLLM's
and S-LoRA's, computes each row's low-rank term ``B A x`` separately in a mixed batch: no
drain, but an extra product per adapted layer at every step. A cached block is found by the
adapter's name as well as its tokens, so keys are never shared across adapters; those of an
adapter switched away wait, evictable, for its next requests.

:meth:`Engine.submit` and :meth:`Engine.cancel` may be called from any thread while one thread
calls :meth:`Engine.step` in a loop (the server's design); :meth:`Engine.run` drives the steps
itself.
"""

from __future__ import annotations

import codecs
import contextlib
import threading
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from minitransformer import _checks
from minitransformer.generation import SamplingParams
from minitransformer.lora import AdapterSet
from minitransformer.paged_cache import BLOCK_SIZE, BlockPool

FINISH_REASONS = ("stop", "length", "cancelled", "error")


class Request:
    """One generation request: a prompt and how to continue it (OpenAI's parameters).

    Args:
        prompt_ids: the prompt's token ids, at least one.
        max_tokens: the most new tokens, at least 1.
        temperature, top_k, top_p, presence_penalty, frequency_penalty: as for
            :func:`~minitransformer.generation.sample_next`; ``temperature=0`` is greedy.
        seed: seeds the request's own ``torch.Generator``: its draws are those of
            ``generate(..., generator=torch.Generator().manual_seed(seed))``; ``None`` draws
            from PyTorch's global generator; from 0 to ``2**64 - 1``. The five options and the
            seed are kept together as ``request.sampling``, a
            :class:`~minitransformer.generation.SamplingParams`.
        stop: a string or strings that end the text; the text stops before it.
        stop_token_ids: the tokens that end the request (not in its text); ``None`` takes the
            engine's ``eos_ids``.
        logprobs: ``None``, or give each new token's raw log-probability (``log_softmax`` of
            the model's scores, before temperature and penalties, as vLLM gives them) and
            those of the ``logprobs`` likeliest tokens (0 for none): the events'
            ``logprob``.
        prompt_logprobs: also give each prompt token's log-probability given the tokens
            before it (the first's is ``None``), with ``logprobs`` alternatives, in the event
            of the first new token (what ``echo`` and lm-eval's loglikelihood need).
        adapter: the name of one of the engine's LoRA adapters to run with (``None``: the base
            model).

    Raises:
        TypeError, ValueError: a bad prompt or option, naming it.
    """

    __slots__ = ("prompt_ids", "max_tokens", "temperature", "top_k", "top_p", "seed", "stop",
                 "presence_penalty", "frequency_penalty", "stop_token_ids", "sampling",
                 "logprobs", "prompt_logprobs", "adapter")

    def __init__(self, prompt_ids: Sequence[int], *, max_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 stop: str | Sequence[str] = (), presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0,
                 stop_token_ids: Sequence[int] | None = None, logprobs: int | None = None,
                 prompt_logprobs: bool = False, adapter: str | None = None):
        self.prompt_ids = _checks.check_id_list("prompt_ids", prompt_ids, allow_empty=False)
        self.max_tokens = _checks.check_int("max_tokens", max_tokens)
        self.sampling = SamplingParams(temperature, top_k, top_p, presence_penalty,
                                       frequency_penalty, seed)
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.presence_penalty, self.frequency_penalty = presence_penalty, frequency_penalty
        self.seed = seed
        if seed is not None and seed > 2**64 - 1:
            raise ValueError(f"seed must be in [0, 2**64 - 1] (what a torch.Generator takes), "
                             f"got {seed}")
        stops = (stop,) if isinstance(stop, str) else stop
        _checks.check_type("stop", stops, (list, tuple), "a str or a list of str")
        for s in stops:
            _checks.check_type("stop", s, str, "a str or a list of str")
            if not s:
                raise ValueError("stop holds an empty string, which would end every text at "
                                 "once")
        self.stop = tuple(stops)
        self.stop_token_ids = (None if stop_token_ids is None
                               else _checks.check_id_list("stop_token_ids", stop_token_ids))
        self.logprobs = None if logprobs is None else _checks.check_int("logprobs", logprobs,
                                                                       low=0)
        self.prompt_logprobs = _checks.check_type("prompt_logprobs", prompt_logprobs, bool,
                                                  "True or False")
        if prompt_logprobs and logprobs is None:
            raise ValueError("prompt_logprobs=True needs logprobs (0 or more alternatives)")
        self.adapter = (None if adapter is None
                        else _checks.check_type("adapter", adapter, str, "a str or None"))

    def __repr__(self) -> str:
        return (f"Request({len(self.prompt_ids)} prompt tokens, max_tokens={self.max_tokens}, "
                f"temperature={self.temperature}, seed={self.seed}"
                + (f", adapter={self.adapter!r})" if self.adapter is not None else ")"))


def _usable(logits: Tensor) -> list[bool]:
    """Whether a token can be chosen from each row of scores ``(B, V)``: no NaN or ``+inf``,
    and not every score ``-inf``."""
    bad = (logits.isnan() | logits.isposinf()).any(dim=-1) | logits.isneginf().all(dim=-1)
    return (~bad).tolist()


def _check_finite_weights(model: nn.Module) -> None:
    """Refuse weights that hold NaN or infinity: every score would be NaN, and a greedy choice
    among NaN scores is token 0, whatever the prompt."""
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"the model's {name} holds NaN or infinity: it cannot generate "
                             f"(a checkpoint damaged, or a training run that diverged)")


class TokenLogprob(NamedTuple):
    """A token's raw log-probability (``log_softmax`` of the model's scores) and the
    ``(token_id, logprob)`` of the likeliest tokens at its position, likeliest first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def token_logprobs(logits: Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """Each row of scores ``(N, V)``'s log-probability of its token in ``tokens`` (``N``), and
    its ``top`` likeliest tokens."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    index = torch.tensor(tokens, dtype=torch.long, device=logp.device)
    chosen = logp.gather(-1, index[:, None])[:, 0].tolist()
    if top:
        values, ids = logp.topk(min(top, logp.shape[-1]), dim=-1)
        tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        tops = [()] * len(chosen)
    return [TokenLogprob(t, lp, best) for t, lp, best in zip(tokens, chosen, tops)]


class Event(NamedTuple):
    """What one step did for one request: ``token_id`` the new token (``None`` for a
    cancellation or an error), ``text`` the new text (``""`` while the bytes of a character or
    a possible stop string are held back; special tokens write none), ``finish_reason``
    ``None`` while it runs, then ``"stop"`` (an end token or a stop string), ``"length"``
    (``max_tokens``), ``"cancelled"``, or ``"error"``: the model's scores for the request
    became NaN or infinite, and no token could be chosen. With the request's ``logprobs``,
    ``logprob`` is the new token's :class:`TokenLogprob`; with ``prompt_logprobs``, the first
    token's event also has the prompt's (``None`` for its first token)."""

    request_id: int
    token_id: int | None
    text: str
    finish_reason: str | None
    logprob: TokenLogprob | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None


class Completion(NamedTuple):
    """A finished request: the new ``token_ids`` (an end token included), its ``text`` (end
    token and stop string left out), ``finish_reason``, and OpenAI's ``usage`` counts; with
    the request's ``logprobs``, each new token's :class:`TokenLogprob` (and the prompt's)."""

    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None


class _Sequence:
    """A request inside the engine: its tokens, blocks, generator and text state."""

    def __init__(self, request_id: int, request: Request, stop_ids: frozenset[int],
                 device: torch.device, vocab_size: int):
        self.id, self.request = request_id, request
        self.tokens = list(request.prompt_ids)       # prompt, then the new tokens
        self.prompt_len = len(self.tokens)
        self.blocks: list[int] = []
        self.cached = 0                              # positions whose keys are in the blocks
        self.shared = 0                              # of them, in blocks shared at admission
        self.stop_ids = stop_ids
        self.generator = request.sampling.make_generator(device)
        penalised = request.sampling.penalised
        self.counts = (torch.zeros(1, vocab_size, dtype=torch.long, device=device)
                       if penalised else None)
        self.greedy = request.temperature == 0 and not penalised
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""                            # decoded text held back for stop strings
        self.finish_reason: str | None = None

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def limit(self) -> int:
        """The most positions it ever caches (the last token is never fed back)."""
        return self.prompt_len + self.request.max_tokens - 1

    def choose(self, logits: Tensor) -> int:
        """The next token from this row's scores ``(1, V)``, as ``generate`` picks it."""
        return int(self.request.sampling.choose(logits, self.counts, self.generator)[0])

    def text_of(self, piece: str, final: bool) -> tuple[str, bool]:
        """The text that may go out after ``piece``, and whether a stop string ended it."""
        self.pending += piece
        stops = self.request.stop
        if not stops:
            out, self.pending = self.pending, ""
            return out, False
        found = [i for i in (self.pending.find(s) for s in stops) if i >= 0]
        if found:
            out, self.pending = self.pending[:min(found)], ""
            return out, True
        if final:
            out, self.pending = self.pending, ""
            return out, False
        # hold back the longest end of the text that may begin a stop string
        hold = max((k for s in stops for k in range(1, min(len(s), len(self.pending)) + 1)
                    if self.pending.endswith(s[:k])), default=0)
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False


class Engine:
    """A continuous-batching engine over a paged KV cache (see the module's notes).

    Args:
        model: a :class:`~minitransformer.gpt.GPT` or :class:`~minitransformer.llama.Llama`;
            it is put in eval mode.
        tokenizer: a :class:`~minitransformer.bpe.BPETokenizer` for the events' text (``None``:
            tokens only, every text ``""``).
        max_batch: the most requests that run at once.
        kv_blocks: the blocks of the pool.
        block_size: positions per block.
        eos_ids: the tokens that end a request (``stop``); ``None`` takes the tokenizer's
            :func:`~minitransformer.chat.stop_token_ids` (``<|end|>`` and the role markers, as
            ``minitransformer chat`` stops; ``<|im_end|>`` first for SmolLM2), or none without
            a tokenizer or a chat format.
        pack_weights: the model's weights also packed for the CPU's matrix products (see the
            module's notes; twice the weights' memory); ``False``: not, and the prefill is
            ``forward``'s bit for bit.
        prefix_caching: share the full blocks of a prompt's beginning with the requests
            whose tokens began the same way (vLLM's automatic prefix caching): the new request
            prefills only the rest. A full block is found by the tokens up to its end (and the
            adapter), and held by reference count (:meth:`BlockPool.share
            <minitransformer.paged_cache.BlockPool.share>`); when its last user ends it keeps
            its keys, evictable, and a later request with the same beginning takes it back,
            until the pool, short of empty blocks, evicts it (least recently used first).
            Its tokens are those without sharing up to float rounding (the rest's prefill
            reads cached keys instead of computing them in the same pass). A request that
            asks for ``prompt_logprobs`` prefills its whole prompt. ``prefix_queries`` and
            ``prefix_hits`` count the prompt positions looked up and found.
        adapters: a :class:`~minitransformer.lora.AdapterSet` over ``model``: a request names
            one of its adapters (``Request.adapter``), which runs merged into the weights; the
            engine serves one adapter at a time (see the module's notes). ``None``: none.

    Raises:
        TypeError, ValueError: a model that is not a GPT or Llama, a bad size or id, weights
            that hold NaN or infinity, ``adapters`` that is not an ``AdapterSet`` over
            ``model``.
    """

    def __init__(self, model: nn.Module, tokenizer: object = None, *, max_batch: int = 16,
                 kv_blocks: int = 256, block_size: int = BLOCK_SIZE,
                 eos_ids: Sequence[int] | None = None, pack_weights: bool = True,
                 prefix_caching: bool = False, adapters: AdapterSet | None = None):
        from minitransformer.models import architecture_of

        architecture_of(model)               # a GPT or a Llama: both have the fast step
        if adapters is not None:
            _checks.check_type("adapters", adapters, AdapterSet, "an AdapterSet or None")
            if adapters.model is not model:
                raise ValueError("adapters is an AdapterSet over another model: make it over "
                                 "the engine's")
            adapters.activate(None)
        self.adapters = adapters
        self.switches = 0                                 # adapter switches so far
        if tokenizer is not None and not callable(getattr(tokenizer, "token_bytes", None)):
            raise TypeError(f"tokenizer must be a BPETokenizer (with token_bytes), got "
                            f"{type(tokenizer).__name__}")
        self.max_batch = _checks.check_int("max_batch", max_batch)
        _checks.check_type("pack_weights", pack_weights, bool, "True or False")
        self.prefix_caching = _checks.check_type("prefix_caching", prefix_caching, bool,
                                                 "True or False")
        self.prefilled = 0                                # positions prefilled, all requests
        self.prefix_queries = 0                           # positions looked up in the cache
        self.prefix_hits = 0                              # of them, found there
        _check_finite_weights(model)
        c = self.config = model.config
        self.model, self.tokenizer = model.eval(), tokenizer
        weight = model.token_embedding.weight
        self.device = weight.device
        kv_heads = getattr(c, "num_kv_heads", c.num_heads)
        self.pool = BlockPool(kv_blocks, block_size, num_layers=c.num_layers,
                              num_kv_heads=kv_heads, head_dim=c.d_model // c.num_heads,
                              device=weight.device, dtype=weight.dtype)
        if eos_ids is None:
            from minitransformer.chat import stop_token_ids

            try:
                eos_ids = [] if tokenizer is None else stop_token_ids(tokenizer)
            except ValueError:                     # no chat format: no end token
                eos_ids = []
        self.eos_ids = frozenset(self._check_vocab("eos_ids",
                                                   _checks.check_id_list("eos_ids", eos_ids)))
        # special tokens write no text, as transformers' decode(skip_special_tokens=True)
        self._special_ids = frozenset((getattr(tokenizer, "special_tokens", None) or {}).values())
        if pack_weights:
            self._prefill_step = self._decode_step = model.make_fast_decode_step(
                pack_weights=True)
        else:
            self._prefill_step = model.make_decode_step()  # bit for bit forward
            self._decode_step = model.make_fast_decode_step()
        self._lock = threading.Lock()                 # the queue, the ids, the cancellations
        self._step_lock = threading.Lock()            # one step at a time
        self._next_id = 0
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._live: set[int] = set()                 # ids waiting or running
        self._to_cancel: set[int] = set()
        self._cancelled: list[Event] = []             # waiting requests cancelled, to report
        self.preemptions = 0                          # how often a request was preempted

    # --- the public side: thread-safe ----------------------------------------------------------

    def submit(self, request: Request) -> int:
        """Queue ``request``; returns its id. Thread-safe.

        Raises:
            TypeError: ``request`` is not a :class:`Request`.
            ValueError: a token outside the vocabulary, a prompt plus ``max_tokens`` past the
                model's context, a request that could never fit the pool, a ``top_k`` past the
                vocabulary, an adapter the engine does not have.
        """
        _checks.check_type("request", request, Request, "a Request")
        c = self.config
        known = () if self.adapters is None else self.adapters.names
        if request.adapter is not None and request.adapter not in known:
            raise ValueError(f"adapter={request.adapter!r}: the engine has no such adapter ("
                             f"{'it has ' + ', '.join(map(repr, known)) if known else 'none'})")
        self._check_vocab("prompt_ids", request.prompt_ids)
        request.sampling.check_vocab(c.vocab_size)
        if request.logprobs is not None and request.logprobs > c.vocab_size:
            raise ValueError(f"logprobs={request.logprobs} is more than the model's "
                             f"vocabulary of {c.vocab_size} tokens")
        stop_ids = (self.eos_ids if request.stop_token_ids is None else
                    frozenset(self._check_vocab("stop_token_ids", request.stop_token_ids)))
        total = len(request.prompt_ids) + request.max_tokens
        if total > c.context_length:
            raise ValueError(f"the prompt's {len(request.prompt_ids)} tokens plus max_tokens="
                             f"{request.max_tokens} make {total}, more than the model's "
                             f"context_length={c.context_length}")
        needed = self.pool.blocks_for(total - 1)
        if needed > self.pool.num_blocks:
            raise ValueError(f"the prompt's {len(request.prompt_ids)} tokens plus max_tokens="
                             f"{request.max_tokens} need {needed} blocks of "
                             f"{self.pool.block_size}, more than the pool's kv_blocks="
                             f"{self.pool.num_blocks}")
        with self._lock:
            request_id = self._next_id
            self._next_id += 1
            self._live.add(request_id)
            self._waiting.append(_Sequence(request_id, request, stop_ids, self.device,
                                           c.vocab_size))
        return request_id

    def cancel(self, request_id: int) -> bool:
        """Cancel a waiting or running request: its blocks are freed, and the next
        :meth:`step` reports it with ``finish_reason="cancelled"``. Thread-safe. Returns
        whether there was such a request still unfinished."""
        with self._lock:
            for seq in self._waiting:
                if seq.id == request_id:
                    self._waiting.remove(seq)
                    self._live.discard(request_id)
                    self._free(seq)
                    self._cancelled.append(Event(request_id, None, "", "cancelled"))
                    return True
            if request_id in self._live:                  # running: the next step ends it
                self._to_cancel.add(request_id)
                return True
        return False

    @property
    def has_work(self) -> bool:
        """Whether a :meth:`step` has something to do (requests waiting or running, or a
        cancellation to report)."""
        return bool(self._waiting or self._running or self._cancelled)

    @property
    def num_free_blocks(self) -> int:
        """The pool's blocks that no request holds (with prefix caching, the evictable ones
        that keep a cached prefix included)."""
        return self.pool.num_free

    @property
    def num_blocks(self) -> int:
        """The pool's blocks."""
        return self.pool.num_blocks

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def kv_usage(self) -> tuple[int, int]:
        """``(used, reserved)``: the positions whose keys and values the requests hold, and the
        positions of the blocks they hold (``block_size`` per block); their ratio is the
        paged cache's overhead."""
        with self._lock:
            seqs = (*self._running, *self._waiting)
            used = sum(s.cached for s in seqs)
            reserved = sum(len(s.blocks) for s in seqs) * self.pool.block_size
        return used, reserved

    def block_tables(self) -> dict[int, list[int]]:
        """Each running request's blocks (a copy), by request id."""
        with self._lock:
            return {seq.id: list(seq.blocks) for seq in (*self._running, *self._waiting)
                    if seq.blocks}

    # --- the steps -----------------------------------------------------------------------------

    def step(self) -> list[Event]:
        """Run one scheduler step (see the module's notes); the events it produced, at most
        one per request."""
        with self._step_lock, torch.inference_mode():
            events: list[Event] = []
            with self._lock:
                events += self._cancelled
                self._cancelled = []
                for seq in [s for s in self._running if s.id in self._to_cancel]:
                    self._running.remove(seq)
                    self._live.discard(seq.id)
                    self._free(seq)
                    events.append(Event(seq.id, None, "", "cancelled"))
                self._to_cancel.clear()
                admitted = self._admit()
            decoding = [s for s in self._running if s.cached == len(s.tokens) - 1]
            self._running += admitted
            for seq in admitted:
                event = self._prefill(seq)
                if event is None:
                    decoding.append(seq)      # recomputed after preemption: decode it now
                else:
                    events.append(event)
            self._running = [s for s in self._running if s.finish_reason is None]
            if decoding:
                events += self._decode(decoding)
            self._running = [s for s in self._running if s.finish_reason is None]
            return events

    def run(self, requests: Sequence[Request]) -> list[Completion]:
        """Submit ``requests`` and step until they are all done; their completions, in order.
        (For tests, the book and the benchmark: nobody else may be stepping the engine.)

        A request that :meth:`submit` refuses raises its ``ValueError`` or ``TypeError`` with
        its index, and the ones before it are cancelled (none is left behind); so is every
        unfinished one when a step fails or the run is interrupted."""
        ids: list[int] = []
        try:
            for k, request in enumerate(requests):
                try:
                    ids.append(self.submit(request))
                except (TypeError, ValueError) as error:
                    raise type(error)(f"requests[{k}]: {error}") from None
            return self._run(requests, ids)
        except BaseException:
            self._cancel_all(ids)
            raise

    def _cancel_all(self, ids: list[int]) -> None:
        """Cancel ``ids`` and report the cancellations, so that their blocks are free and
        nothing of theirs is left waiting or running."""
        if any([self.cancel(i) for i in ids]):
            with contextlib.suppress(Exception):
                while self._to_cancel or self._cancelled:
                    self.step()

    def _run(self, requests: Sequence[Request], ids: list[int]) -> list[Completion]:
        tokens: dict[int, list[int]] = {i: [] for i in ids}
        texts: dict[int, list[str]] = {i: [] for i in ids}
        logprobs: dict[int, list[TokenLogprob]] = {i: [] for i in ids}
        prompt_logprobs: dict[int, list | None] = {i: None for i in ids}
        finished: dict[int, str] = {}
        while len(finished) < len(ids):
            if not self.has_work:
                raise RuntimeError("the engine has no work left but requests are unfinished")
            for event in self.step():
                if event.request_id not in tokens:
                    continue
                if event.token_id is not None:
                    tokens[event.request_id].append(event.token_id)
                if event.logprob is not None:
                    logprobs[event.request_id].append(event.logprob)
                if event.prompt_logprobs is not None:
                    prompt_logprobs[event.request_id] = event.prompt_logprobs
                texts[event.request_id].append(event.text)
                if event.finish_reason == "error":
                    k = ids.index(event.request_id)
                    raise FloatingPointError(
                        f"requests[{k}]: the model's scores became NaN or infinite after "
                        f"{len(tokens[event.request_id])} new tokens, so no token can be "
                        f"chosen (weights changed to NaN, or numbers past the model's dtype)")
                if event.finish_reason is not None:
                    finished[event.request_id] = event.finish_reason
        return [Completion(tokens[i], "".join(texts[i]), finished[i], len(r.prompt_ids),
                           len(tokens[i]), None if r.logprobs is None else logprobs[i],
                           prompt_logprobs[i]) for i, r in zip(ids, requests)]

    def _admit(self) -> list[_Sequence]:
        """Take waiting requests (oldest first) while a row and their blocks are free."""
        pool = self.pool
        growth = sum(1 for s in self._running if pool.blocks_for(s.cached + 1) > len(s.blocks))
        budget = pool.num_free - growth
        admitted = []
        while self._waiting and len(self._running) + len(admitted) < self.max_batch:
            seq = self._waiting[0]
            if self.adapters is not None and seq.request.adapter != self.adapters.active:
                if self._running or admitted:
                    break                   # the running requests finish, then it switches
                self._switch(seq.request.adapter)
            prefill = len(seq.tokens) - (1 if seq.generated else 0)
            shared = self._shared_blocks(seq, prefill)
            revived = sum(1 for block in shared if not pool.users(block))   # evictable ones
            need = pool.blocks_for(min(len(seq.tokens) + 1, seq.limit)) - len(shared) + revived
            if need > budget:
                break
            self._waiting.popleft()
            pool.share(shared)
            seq.shared = len(shared) * pool.block_size
            seq.blocks = shared + pool.allocate(pool.blocks_for(prefill) - len(shared))
            budget -= need
            admitted.append(seq)
        return admitted

    def _switch(self, adapter: str | None) -> None:
        """Merge ``adapter`` into the weights (``None``: the base), with no request running.
        A cached block's key names its adapter, so no block of keys computed with one
        adapter's weights is ever shared with another's request."""
        if self.pool.allocated:
            raise RuntimeError("blocks are held while no request runs: a bug")
        self.adapters.activate(adapter)
        self.switches += 1

    def _key(self, seq: _Sequence, end: int) -> tuple:
        """What finds a block that holds ``seq``'s positions up to ``end``: its adapter and
        its tokens from the start."""
        return seq.request.adapter, tuple(seq.tokens[:end])

    def _shared_blocks(self, seq: _Sequence, prefill: int) -> list[int]:
        """The cached blocks (held or evictable) that hold the keys of ``seq``'s first tokens:
        full blocks, found by the tokens up to their end, leaving at least one token to
        prefill (its scores give the next token)."""
        if not self.prefix_caching or seq.request.prompt_logprobs:
            return []
        size, found = self.pool.block_size, []
        for i in range((prefill - 1) // size):
            block = self.pool.find(self._key(seq, (i + 1) * size))
            if block is None:
                break
            found.append(block)
        return found

    def _share_more(self, seq: _Sequence, length: int) -> None:
        """Swap ``seq``'s own blocks for shared ones that requests prefilled since its
        admission (in the same step, say) wrote with the same tokens."""
        size = self.pool.block_size
        with self._lock:
            shared = self._shared_blocks(seq, length)
            first = seq.shared // size
            if len(shared) > first:
                self.pool.share(shared[first:])
                self.pool.free(seq.blocks[first:len(shared)])
                seq.blocks[first:len(shared)] = shared[first:]
                seq.shared = len(shared) * size

    def _register(self, seq: _Sequence, first: int, end: int) -> None:
        """Make ``seq``'s full blocks ``first`` to ``end - 1`` findable by their tokens."""
        size = self.pool.block_size
        for i in range(first, end):
            self.pool.cache(seq.blocks[i], self._key(seq, (i + 1) * size))

    def _prefill(self, seq: _Sequence) -> Event | None:
        """Run the prompt (and, after a preemption, the tokens written so far but the last)
        through the model alone; the event of its next token, or ``None`` when it was
        recomputed and its next token is still to decode."""
        length = len(seq.tokens) - (1 if seq.generated else 0)
        if self.prefix_caching:
            self._share_more(seq, length)
        start = seq.shared
        idx = torch.tensor([seq.tokens[start:length]], dtype=torch.long, device=self.device)
        view = self.pool.view([seq.blocks], [start], length - start)
        if start:                        # after the shared blocks' positions
            logits = self._prefill_step(idx, view, attention_mask=view.attention_mask,
                                        position_ids=view.position_ids)
        else:
            logits = self._prefill_step(idx, view)                       # (1, T, V)
        seq.cached = length
        self.prefilled += length - start
        if self.prefix_caching and not seq.request.prompt_logprobs:    # it looked them up
            self.prefix_queries += length
            self.prefix_hits += start
        if not _usable(logits[:, -1])[0]:
            return self._fail(seq)
        if self.prefix_caching:
            self._register(seq, start // self.pool.block_size, length // self.pool.block_size)
        if seq.generated:
            return None
        token = seq.choose(logits[:, -1])
        request = seq.request
        if request.logprobs is None:
            return self._accept(seq, token)
        (logprob,) = token_logprobs(logits[0, -1:], [token], request.logprobs)
        prompt = None
        if request.prompt_logprobs:
            prompt = [None, *token_logprobs(logits[0, :-1], seq.tokens[1:length],
                                            request.logprobs)]
        return self._accept(seq, token, logprob, prompt)

    def _decode(self, rows: list[_Sequence]) -> list[Event]:
        """One new token for every row, in one batched forward pass."""
        rows = self._make_room(rows)
        if not rows:
            return []
        view = self.pool.view([s.blocks for s in rows], [s.cached for s in rows], 1)
        idx = torch.tensor([[s.tokens[-1]] for s in rows], dtype=torch.long, device=self.device)
        logits = self._decode_step(idx, view, attention_mask=view.attention_mask,
                                   position_ids=view.position_ids)[:, -1]   # (B, V)
        greedy = [i for i, s in enumerate(rows) if s.greedy]
        best = logits[greedy].argmax(dim=-1).tolist() if greedy else []
        chosen = dict(zip(greedy, best))
        usable = _usable(logits)
        events = []
        size = self.pool.block_size
        for i, seq in enumerate(rows):
            seq.cached += 1
            if not usable[i]:
                events.append(self._fail(seq))
                continue
            if self.prefix_caching and not seq.cached % size:      # a block filled: cache it
                self._register(seq, seq.cached // size - 1, seq.cached // size)
            token = chosen[i] if i in chosen else seq.choose(logits[i:i + 1])
            top = seq.request.logprobs
            logprob = None if top is None else token_logprobs(logits[i:i + 1], [token], top)[0]
            events.append(self._accept(seq, token, logprob))
        return events

    def _make_room(self, rows: list[_Sequence]) -> list[_Sequence]:
        """Give each row the block its next position needs, preempting the youngest running
        request while the pool is empty; the rows still running."""
        pool = self.pool
        for seq in list(rows):
            if seq not in self._running:                 # preempted below
                continue
            while pool.blocks_for(seq.cached + 1) > len(seq.blocks):
                block = pool.allocate(1)
                if block is not None:
                    seq.blocks += block
                    continue
                victim = self._running[-1]               # the youngest
                self._preempt(victim)
                if victim is seq:
                    break
        return [s for s in rows if s in self._running]

    def _preempt(self, seq: _Sequence) -> None:
        """Free ``seq``'s blocks and put it back at the front of the queue."""
        self.preemptions += 1
        self._running.remove(seq)
        with self._lock:
            self._free(seq)
            seq.cached = 0
            if seq.id in self._to_cancel:          # cancelled meanwhile: report it now
                self._to_cancel.discard(seq.id)
                self._live.discard(seq.id)
                self._cancelled.append(Event(seq.id, None, "", "cancelled"))
            else:
                self._waiting.appendleft(seq)

    def _free(self, seq: _Sequence) -> None:
        """Give ``seq``'s blocks back (a shared one stays with its other users; a cached one
        that none holds stays findable, evictable)."""
        if seq.blocks:
            self.pool.free(seq.blocks)
            seq.blocks = []

    def _accept(self, seq: _Sequence, token: int, logprob: TokenLogprob | None = None,
                prompt_logprobs: list | None = None) -> Event:
        """Record ``token`` for ``seq``; its event, and the end of ``seq`` if it is done."""
        seq.tokens.append(token)
        if seq.counts is not None:
            seq.counts[0, token] += 1
        finish = None
        if token in seq.stop_ids:
            text, _ = seq.text_of(self._flush(seq), final=True)
            finish = "stop"
        else:
            piece = ""
            if self.tokenizer is not None and token not in self._special_ids:
                piece = seq.decoder.decode(self.tokenizer.token_bytes(token))
            text, stopped = seq.text_of(piece, final=False)
            if stopped:
                finish = "stop"
            elif seq.generated >= seq.request.max_tokens:
                more, stopped = seq.text_of(self._flush(seq), final=True)
                text += more
                finish = "stop" if stopped else "length"
        if finish is not None:
            self._end(seq, finish)
        return Event(seq.id, token, text, finish, logprob, prompt_logprobs)

    def _fail(self, seq: _Sequence) -> Event:
        """End ``seq`` whose scores are not finite (no token can be chosen from NaN)."""
        self._end(seq, "error")
        return Event(seq.id, None, "", "error")

    def _end(self, seq: _Sequence, finish: str) -> None:
        seq.finish_reason = finish
        with self._lock:
            self._free(seq)
            self._live.discard(seq.id)
            self._to_cancel.discard(seq.id)

    def _flush(self, seq: _Sequence) -> str:
        return seq.decoder.decode(b"", final=True) if self.tokenizer is not None else ""

    def _check_vocab(self, name: str, ids: list[int]) -> list[int]:
        for i, t in enumerate(ids):
            if t >= self.config.vocab_size:
                raise ValueError(f"{name}[{i}] is {t}, outside the model's vocabulary "
                                 f"[0, {self.config.vocab_size})")
        return ids

    def __repr__(self) -> str:
        return (f"Engine(max_batch={self.max_batch}, kv_blocks={self.pool.num_blocks}, "
                f"block_size={self.pool.block_size}, running={len(self._running)}, "
                f"waiting={len(self._waiting)})")
