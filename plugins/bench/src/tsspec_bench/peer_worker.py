"""A peer engine in its own process: ``python -m tsspec_bench.peer_worker ENGINE GGUF THREADS``.

``tsspec bench --compare`` starts one of these per peer (see ``peers.PeerProcess``) with the
environment tsspec itself was started with, minus the OpenMP settings that change how another
engine's thread pool waits (``peers.peer_environment``): a peer runs in its own default
configuration, never in whatever tsspec's process set up for itself.

Protocol: one JSON object per line on stdin, one answer per line on stdout. The first line the
worker writes is ``{"ready": {...}}`` (what it loaded, its environment) or ``{"error": "..."}``.

* ``{"op": "generate", "config": NAME, "prompt_ids": [...], "max_tokens": N}`` ->
  ``{"tokens": [...], "tps": decode tok/s, "seconds": whole call}``; with ``"max_seconds": S``
  the run also stops S seconds after its first token, and with ``"reuse_prompt": true`` llama.cpp
  keeps the prompt's KV from the previous run (the probe's runs, timed over decoding only: a
  slow variant costs little, and no run prefills the same prompt again)
* ``{"op": "prefill", "prompt_ids": [...]}`` -> ``{"seconds": prompt processing}``
* ``{"op": "quit"}``

* ``{"op": "keep", "configs": [...]}`` -> ``{"kept": [...]}``: frees every llama.cpp context the
  named variants do not use (after the probe; a prompt-lookup context holds n_ctx x vocab logits)

Configurations: ``plain`` and ``prompt-lookup`` for both engines, each in variants named by
``/``-separated fields. Prompt lookup comes with several draft lengths (field ``nN``: N tokens a
draft; both engines' default is 10, which drafts long runs of mostly wrong tokens and makes every
verify a 11-row forward). llama.cpp also offers two documented APIs (``generate``,
``create_completion``) and flash attention off / on (``fa0``, ``fa1``): ``plain/generate/fa0``,
``prompt-lookup/generate/fa0/n3`` ... ``configs`` lists them, and the parent probes them on one
prompt and keeps the fastest of each kind (``peers.PeerProcess.tune``).

llama-cpp-python's prompt lookup (``LlamaPromptLookupDecoding``, max n-gram 2) needs every row's
logits (``generate`` samples each drafted position from its own row): ``Llama(draft_model=...)``
turns ``logits_all`` on by itself (llama.py: ``_logits_all = logits_all if draft_model is None
else True``), so each verify also computes the output head on all its rows and copies them into
a numpy array. The worker still passes ``logits_all=True``: the library sizes that array from
the argument (``n_ctx`` rows with it, ``n_batch`` without), and without it a context longer than
``n_batch`` tokens fails ("could not broadcast input array", checked on 0.3.36).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Sequence

PLAIN, LOOKUP = "plain", "prompt-lookup"
BEST = "best"  # per pair, the faster of the two (a report row, never a variant)
PROMPT_LOOKUP_TOKENS = 10  # tokens per prompt-lookup draft: both peers' default
# the draft lengths probed (field "nN" of a prompt-lookup variant), each engine's default among them
LLAMA_CPP_DRAFT_TOKENS = (2, 3, 4, 6, 10)
TRANSFORMERS_DRAFT_TOKENS = (3, 5, 10)


def draft_tokens(variant: str) -> int | None:
    """The draft length a prompt-lookup variant names (its ``nN`` field), else None.

    >>> draft_tokens("prompt-lookup/generate/fa0/n3"), draft_tokens("plain/generate/fa0")
    (3, None)
    """
    for part in variant.split("/")[1:]:
        if part[:1] == "n" and part[1:].isdigit():
            return int(part[1:])
    return None


def decode_rate(times: Sequence[float], counts: Sequence[int]) -> float:
    """tok/s after the first emitted token: tokens arriving after it over the time they took."""
    if len(times) < 2:
        return 0.0
    span = times[-1] - times[0]
    return (sum(counts) - counts[0]) / span if span > 0 else 0.0


class TransformersEngine:
    """Hugging Face transformers on the GGUF (dequantised to float32 on load: slow, once)."""

    def __init__(self, gguf_path: str, threads: int):
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        torch.set_num_threads(threads)
        directory, name = os.path.split(gguf_path)
        self.model = AutoModelForCausalLM.from_pretrained(directory or ".", gguf_file=name, dtype=torch.float32)
        self.model.eval()
        self.torch = torch
        self.configs = [PLAIN, *(f"{LOOKUP}/n{n}" for n in TRANSFORMERS_DRAFT_TOKENS)]
        self.info = {"transformers": __import__("transformers").__version__, "torch": torch.__version__,
                     "threads": torch.get_num_threads()}

    def generate(self, config: str, prompt_ids: Sequence[int], max_tokens: int, stop: Sequence[int],
                 max_seconds: float | None = None, reuse_prompt: bool = False):
        from transformers.generation.streamers import BaseStreamer

        times: list[float] = []
        counts: list[int] = []

        class _Clock(BaseStreamer):
            """Records when new tokens arrive (the first put is the prompt itself)."""

            def __init__(self):
                self.prompt_seen = False

            def put(self, value):
                if not self.prompt_seen:
                    self.prompt_seen = True
                    return
                times.append(time.perf_counter())
                counts.append(int(value.numel()))

            def end(self):
                pass

        torch = self.torch
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        extra = {"prompt_lookup_num_tokens": draft_tokens(config) or PROMPT_LOOKUP_TOKENS} if config.startswith(LOOKUP) else {}
        if max_seconds:
            from transformers import StoppingCriteria, StoppingCriteriaList

            class _DecodeTime(StoppingCriteria):
                """Stops ``max_seconds`` after the first emitted token (prefill not counted)."""

                def __call__(self, input_ids, scores, **kwargs):
                    done = bool(times) and time.perf_counter() - times[0] > max_seconds
                    return torch.full((input_ids.shape[0],), done, dtype=torch.bool)

            extra["stopping_criteria"] = StoppingCriteriaList([_DecodeTime()])
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                temperature=None, top_p=None, top_k=None, eos_token_id=list(stop) or None,
                pad_token_id=(list(stop) or [0])[0], streamer=_Clock(), **extra,
            )
        seconds = time.perf_counter() - start
        return [int(t) for t in out[0, ids.shape[1]:]], decode_rate(times, counts), seconds

    def prefill(self, prompt_ids: Sequence[int]) -> float:
        torch = self.torch
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        start = time.perf_counter()
        with torch.inference_mode():
            self.model(ids, use_cache=True)
        return time.perf_counter() - start


class LlamaCppEngine:
    """llama.cpp through llama-cpp-python, threads = cores for decoding and for batches. One
    context per (draft length or plain, flash attention, batch size), created on first use."""

    def __init__(self, gguf_path: str, threads: int, n_ctx: int = 4096):
        import llama_cpp

        self.llama_cpp = llama_cpp
        self.path, self.threads, self.n_ctx = gguf_path, threads, n_ctx
        self.contexts: dict[tuple, object] = {}
        apis = ("generate", "create_completion")
        self.configs = [f"{PLAIN}/{api}/fa{fa}" for api in apis for fa in (0, 1)]
        self.configs += [f"{LOOKUP}/{api}/fa{fa}/n{n}" for n in LLAMA_CPP_DRAFT_TOKENS for api in apis for fa in (0, 1)]
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        system = llama_cpp.llama_print_system_info()
        doc = (LlamaPromptLookupDecoding.__doc__ or "").strip().splitlines()
        self.info = {"llama_cpp_python": llama_cpp.__version__, "threads": threads, "n_threads_batch": threads,
                     "system": (system.decode() if isinstance(system, bytes) else str(system)).strip(),
                     "lookup": f"{LlamaPromptLookupDecoding.__module__}.{LlamaPromptLookupDecoding.__qualname__}"
                               + (f" ({doc[0].strip()})" if doc else "")}
        self._context(0, 0, 512)  # load once now: a file the engine cannot read fails here

    @staticmethod
    def _parse(config: str) -> tuple[str, str, int, int]:
        """(kind, api, flash attention, draft tokens: 0 for plain) of a variant name."""
        fields = config.split("/")
        kind = fields[0]
        api = next((f for f in fields[1:] if f in ("generate", "create_completion")), "generate")
        fa = next((int(f[2:]) for f in fields[1:] if f[:2] == "fa" and f[2:].isdigit()), 0)
        lookup = (draft_tokens(config) or PROMPT_LOOKUP_TOKENS) if kind == LOOKUP else 0
        return kind, api, fa, lookup

    def _context(self, lookup: int, fa: int, n_batch: int):
        """The context for ``lookup`` tokens a draft (0: plain decoding)."""
        key = (lookup, fa, n_batch)
        if key not in self.contexts:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            # logits_all: every row's logits, in an array of n_ctx rows (see the module docstring)
            extra = {"logits_all": True, "draft_model": LlamaPromptLookupDecoding(num_pred_tokens=lookup)} if lookup else {}
            self.contexts[key] = Llama(
                model_path=self.path, n_ctx=self.n_ctx, n_threads=self.threads, n_threads_batch=self.threads,
                n_batch=n_batch, flash_attn=bool(fa), verbose=False, seed=0, **extra,
            )
        return self.contexts[key]

    def generate(self, config: str, prompt_ids: Sequence[int], max_tokens: int, stop: Sequence[int],
                 max_seconds: float | None = None, reuse_prompt: bool = False):
        _, api, fa, lookup = self._parse(config)
        llm = self._context(lookup, fa, 512)
        if not reuse_prompt:
            llm.reset()  # no prefix reuse between runs: every run prefills, like tsspec's
        stops = set(int(t) for t in stop) | {int(llm.token_eos())}
        tokens: list[int] = []
        times: list[float] = []
        start = time.perf_counter()
        if api == "create_completion":
            # the text API: one chunk per token (timed as it arrives); the API returns text, so
            # the token ids for the output comparison are the text tokenised again
            text = []
            for chunk in llm.create_completion(list(prompt_ids), max_tokens=max_tokens, temperature=0.0, top_k=1,
                                               top_p=1.0, min_p=0.0, repeat_penalty=1.0, stream=True, seed=0):
                times.append(time.perf_counter())
                text.append(chunk["choices"][0]["text"])
                if max_seconds and times[-1] - times[0] > max_seconds:
                    break
            seconds = time.perf_counter() - start
            tokens = [int(t) for t in llm.tokenize("".join(text).encode("utf-8"), add_bos=False, special=True)]
            return tokens, decode_rate(times, [1] * len(times)), seconds
        for tok in llm.generate(list(prompt_ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                reset=True):
            times.append(time.perf_counter())
            tokens.append(int(tok))
            if int(tok) in stops or len(tokens) >= max_tokens or (max_seconds and times[-1] - times[0] > max_seconds):
                break
        seconds = time.perf_counter() - start
        return tokens, decode_rate(times, [1] * len(times)), seconds

    def keep(self, configs: Sequence[str]) -> list[str]:
        """Free the contexts no variant in ``configs`` (nor the prefill's) uses."""
        used = {(self._parse(c)[3], self._parse(c)[2], 512) for c in configs}
        for key in [k for k in self.contexts if k[0] and k not in used]:
            context = self.contexts.pop(key)
            if hasattr(context, "close"):
                context.close()
        return sorted(configs)

    def prefill(self, prompt_ids: Sequence[int], n_batch: int = 512, fa: int = 0) -> float:
        llm = self._context(0, fa, n_batch)
        llm.reset()
        start = time.perf_counter()
        llm.eval(list(prompt_ids))
        return time.perf_counter() - start


ENGINES = {"transformers": TransformersEngine, "llama.cpp": LlamaCppEngine}
MISSING_HINT = {
    "transformers": "pip install 'transformers>=5' accelerate",
    "llama.cpp": "python -m tsspec_bench.peer_build (llama-cpp-python 0.3.36 built with this CPU's SIMD flags)",
}


def _answer(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    engine_name, path, threads = (list(sys.argv[1:] if argv is None else argv) + ["", "", "0"])[:3]
    if engine_name not in ENGINES:
        _answer({"error": f"unknown peer {engine_name!r}"})
        return 2
    try:
        engine = ENGINES[engine_name](path, int(threads) or (os.cpu_count() or 1))
    except ImportError as exc:
        _answer({"error": f"--compare {engine_name} needs {exc.name or 'a missing package'}: {MISSING_HINT[engine_name]}"})
        return 2
    except Exception as exc:  # the engine's own loader: report, do not crash the bench
        _answer({"error": f"{engine_name} cannot load {path}: {type(exc).__name__}: {exc}"})
        return 2
    env = {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("OMP_", "GOMP_", "KMP_", "MKL_"))}
    _answer({"ready": {"configs": engine.configs, "info": engine.info, "environment": env}})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        op = request.get("op")
        try:
            if op == "quit":
                break
            if op == "generate":
                tokens, tps, seconds = engine.generate(request["config"], request["prompt_ids"],
                                                       int(request["max_tokens"]), request.get("stop", []),
                                                       request.get("max_seconds"), bool(request.get("reuse_prompt")))
                _answer({"tokens": tokens, "tps": tps, "seconds": seconds})
            elif op == "keep":
                keep = getattr(engine, "keep", None)
                _answer({"kept": keep(request["configs"]) if keep else list(request["configs"])})
            elif op == "prefill":
                extra = {k: request[k] for k in ("n_batch", "fa") if k in request}
                _answer({"seconds": engine.prefill(request["prompt_ids"], **extra)})
            else:
                _answer({"error": f"unknown op {op!r}"})
        except Exception as exc:
            _answer({"error": f"{type(exc).__name__}: {exc}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
