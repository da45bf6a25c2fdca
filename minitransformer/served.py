"""A model behind a running server, as :mod:`minitransformer.evaluation` reads one (chapter 20).

:class:`ServedModel` talks to ``python -m minitransformer serve`` (or another server with
OpenAI's ``/v1/completions`` and vLLM's ``/tokenize`` and ``/detokenize``) with the standard
library alone. It is both the model and the tokenizer of an evaluation:

* ``encode`` and ``decode`` are the server's ``/tokenize`` and ``/detokenize``, so texts are
  split into tokens exactly as the served model splits them;
* :meth:`ServedModel.log_likelihoods` sends each sequence as a prompt of token ids with
  ``echo: true, logprobs: 1, max_tokens: 0``: the server answers with the log-probability of
  every prompt token given those before it, which is what lm-eval's ``local-completions``
  model reads too;
* :meth:`ServedModel.complete` asks for greedy completions (``temperature: 0``).

A server refuses a prompt that leaves no room for a new token, so a sequence it scores holds at
most ``context_length - 1`` tokens, one fewer than a model in this process reads
(:attr:`ServedModel.window` is ``context_length - 2``, the context a scored token can have).
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Sequence

from minitransformer import _checks

__all__ = ["ServedModel"]


class ServedModel:
    """A model served at ``url`` (``http://host:port``, with or without ``/v1``).

    Args:
        model: the served model's name (default: the base model, the one with no parent in
            ``/v1/models``).
        api_key: sent as ``Authorization: Bearer KEY``.
        timeout: seconds to wait for one answer.

    Raises:
        TypeError: options of the wrong type.
        ValueError: a URL that is not ``http(s)://``, a model the server does not serve, a
            server that does not answer as ``minitransformer serve`` does.
        ConnectionError: nothing answers at ``url``.
    """

    def __init__(self, url: str, *, model: str | None = None, api_key: str | None = None,
                 timeout: float = 600.0) -> None:
        _checks.check_type("url", url, str, "a str")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/").removesuffix("/v1")
        if model is not None:
            _checks.check_type("model", model, str, "a str or None")
        if api_key is not None:
            _checks.check_type("api_key", api_key, str, "a str or None")
        self.api_key = api_key
        self.timeout = _checks.check_number("timeout", timeout, low=0)
        cards = self._call("/v1/models").get("data")
        if not isinstance(cards, list) or not all(isinstance(c, dict) and "id" in c
                                                  for c in cards):
            raise ValueError(f"{self.url}/v1/models does not list models as OpenAI's API does")
        names = [c["id"] for c in cards]
        if model is None:
            model = next((c["id"] for c in cards if c.get("parent") is None), None)
            if model is None:
                raise ValueError(f"{self.url} serves no model")
        elif model not in names:
            raise ValueError(f"{self.url} does not serve {model!r}; it serves "
                             f"{', '.join(map(repr, names))}")
        self.name = model
        reply = self._call("/tokenize", {"model": model, "prompt": "a"})
        if not isinstance(reply.get("max_model_len"), int):
            raise ValueError(f"{self.url}/tokenize does not say the context length "
                             f"(max_model_len), as vLLM's and minitransformer serve's do")
        #: the served model's context length, in tokens
        self.context_length: int = reply["max_model_len"]
        self._encoded: dict[str, list[int]] = {}

    @property
    def window(self) -> int:
        """The most tokens a scored token can be read after, ``context_length - 2``, since a
        prompt of ``n`` tokens must leave room for one new token, and its last token is read
        by no score."""
        return self.context_length - 2

    def __repr__(self) -> str:
        return f"ServedModel({self.url!r}, model={self.name!r})"

    # ----- HTTP ---------------------------------------------------------------------------

    def _call(self, path: str, body: dict | None = None) -> dict:
        """GET ``path`` (``body`` None) or POST ``body`` as JSON; the answer's JSON object."""
        headers = {"Content-Type": "application/json"}
        if self.api_key is not None:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = exc.reason
            raise ValueError(f"{self.url}{path} answered HTTP {exc.code}: {message}") from None
        except (urllib.error.URLError, socket.timeout, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConnectionError(f"cannot reach {self.url} ({reason})") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ValueError(f"{self.url}{path} did not answer a JSON object: not an "
                             f"OpenAI-compatible server?")
        return answer

    # ----- the tokenizer ------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The served model's token ids of ``text`` (no special tokens added)."""
        _checks.check_type("text", text, str, "a str")
        if text not in self._encoded:
            reply = self._call("/tokenize", {"model": self.name, "prompt": text,
                                             "add_special_tokens": False})
            self._encoded[text] = list(reply["tokens"])
        return list(self._encoded[text])

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids."""
        return self._call("/detokenize", {"model": self.name, "tokens": list(ids)})["prompt"]

    def token_id(self, text: str) -> int | None:
        """The id of the one token ``text`` is (a special token's name, say), else ``None``."""
        ids = self.encode(text)
        return ids[0] if len(ids) == 1 else None

    # ----- the model ----------------------------------------------------------------------

    def log_likelihoods(self, requests: Sequence[tuple[Sequence[int], int]], *,
                        batch_size: int = 8) -> list[tuple[float, bool]]:
        """For each ``(tokens, n)``: the sum of the log-probabilities of the last ``n``
        tokens given those before them, and whether each was the likeliest token (``echo``
        with ``logprobs: 1``, ``batch_size`` prompts a request)."""
        _checks.check_int("batch_size", batch_size)
        results = []
        for start in range(0, len(requests), batch_size):
            batch = requests[start:start + batch_size]
            reply = self._call("/v1/completions", {
                "model": self.name, "prompt": [list(tokens) for tokens, _ in batch],
                "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0})
            choices = self._choices(reply, len(batch))
            for choice, (tokens, n) in zip(choices, batch):
                given = (choice.get("logprobs") or {}).get("token_logprobs") or []
                values = given[len(given) - n:]
                if len(given) != len(tokens) or n >= len(tokens) or None in values:
                    raise ValueError(f"{self.url}/v1/completions gave {len(given)} prompt "
                                     f"log-probabilities for a prompt of {len(tokens)} tokens "
                                     f"(echo with logprobs)")
                tops = choice["logprobs"]["top_logprobs"][len(given) - n:]
                greedy = all(v >= max(top.values()) for v, top in zip(values, tops))
                results.append((float(sum(values)), greedy))
        return results

    def complete(self, prompts: Sequence[str], *, max_tokens: int,
                 stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (),
                 batch_size: int = 8) -> list[str]:
        """Greedy completions of ``prompts``: at most ``max_tokens`` each, ended by a string of
        ``stop`` (at most 4, OpenAI's limit) or a token of ``stop_token_ids`` (vLLM's
        parameter, which ``minitransformer serve`` takes)."""
        _checks.check_int("max_tokens", max_tokens)
        _checks.check_int("batch_size", batch_size)
        answers = []
        for start in range(0, len(prompts), batch_size):
            body = {"model": self.name, "prompt": list(prompts[start:start + batch_size]),
                    "max_tokens": max_tokens, "temperature": 0}
            if stop:
                body["stop"] = list(stop)
            if stop_token_ids:
                body["stop_token_ids"] = list(stop_token_ids)
            reply = self._call("/v1/completions", body)
            answers += [c["text"] for c in self._choices(reply, len(body["prompt"]))]
        return answers

    def _choices(self, reply: dict, count: int) -> list[dict]:
        """A completion's ``count`` choices in order, or a ValueError that says so."""
        choices = reply.get("choices")
        if not isinstance(choices, list) or len(choices) != count:
            raise ValueError(f"{self.url}/v1/completions answered "
                             f"{len(choices) if isinstance(choices, list) else 'no'} choices "
                             f"for {count} prompts")
        return sorted(choices, key=lambda c: c["index"])
