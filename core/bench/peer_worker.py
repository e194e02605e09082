"""A peer engine in its own process: ``python -m tsspec.bench.peer_worker ENGINE GGUF THREADS``.

``tsspec bench --compare`` starts one of these per peer (see ``peers.PeerProcess``) with the
environment tsspec itself was started with, minus the OpenMP settings that change how another
engine's thread pool waits (``peers.peer_environment``): a peer runs in its own default
configuration, never in whatever tsspec's process set up for itself.

Protocol: one JSON object per line on stdin, one answer per line on stdout. The first line the
worker writes is ``{"ready": {...}}`` (what it loaded, its environment) or ``{"error": "..."}``.

* ``{"op": "generate", "config": NAME, "prompt_ids": [...], "max_tokens": N}`` ->
  ``{"tokens": [...], "tps": decode tok/s, "seconds": whole call}``
* ``{"op": "prefill", "prompt_ids": [...]}`` -> ``{"seconds": prompt processing}``
* ``{"op": "quit"}``

Configurations: ``plain`` and ``prompt-lookup`` (10 tokens a draft) for both engines. llama.cpp
offers several documented variants of each (the ``generate`` and ``create_completion`` APIs,
flash attention off / on); ``configs`` lists them as ``plain/generate/fa0`` etc., and the parent
picks the fastest of each kind after a short probe.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Sequence

PLAIN, LOOKUP = "plain", "prompt-lookup"
PROMPT_LOOKUP_TOKENS = 10  # tokens per prompt-lookup draft, both peers (their usual setting)


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
        self.configs = [PLAIN, LOOKUP]
        self.info = {"transformers": __import__("transformers").__version__, "torch": torch.__version__,
                     "threads": torch.get_num_threads()}

    def generate(self, config: str, prompt_ids: Sequence[int], max_tokens: int, stop: Sequence[int]):
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
        extra = {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS} if config.startswith(LOOKUP) else {}
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
    context per (prompt lookup, flash attention) pair, created on first use."""

    def __init__(self, gguf_path: str, threads: int, n_ctx: int = 4096):
        import llama_cpp

        self.llama_cpp = llama_cpp
        self.path, self.threads, self.n_ctx = gguf_path, threads, n_ctx
        self.contexts: dict[tuple, object] = {}
        self.configs = [f"{kind}/{api}/fa{fa}" for kind in (PLAIN, LOOKUP) for api in ("generate", "create_completion")
                        for fa in (0, 1)]
        system = llama_cpp.llama_print_system_info()
        self.info = {"llama_cpp_python": llama_cpp.__version__, "threads": threads, "n_threads_batch": threads,
                     "system": system.decode() if isinstance(system, bytes) else str(system)}
        self._context(False, 0, 512)  # load once now: a file the engine cannot read fails here

    def _context(self, lookup: bool, fa: int, n_batch: int):
        key = (lookup, fa, n_batch)
        if key not in self.contexts:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            extra = {"logits_all": True, "draft_model": LlamaPromptLookupDecoding(num_pred_tokens=PROMPT_LOOKUP_TOKENS)} if lookup else {}
            self.contexts[key] = Llama(
                model_path=self.path, n_ctx=self.n_ctx, n_threads=self.threads, n_threads_batch=self.threads,
                n_batch=n_batch, flash_attn=bool(fa), verbose=False, seed=0, **extra,
            )
        return self.contexts[key]

    def generate(self, config: str, prompt_ids: Sequence[int], max_tokens: int, stop: Sequence[int]):
        kind, api, fa = (config.split("/") + ["generate", "fa0"])[:3]
        llm = self._context(kind == LOOKUP, int(fa[-1]), 512)
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
            seconds = time.perf_counter() - start
            tokens = [int(t) for t in llm.tokenize("".join(text).encode("utf-8"), add_bos=False, special=True)]
            return tokens, decode_rate(times, [1] * len(times)), seconds
        for tok in llm.generate(list(prompt_ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                reset=True):
            times.append(time.perf_counter())
            tokens.append(int(tok))
            if int(tok) in stops or len(tokens) >= max_tokens:
                break
        seconds = time.perf_counter() - start
        return tokens, decode_rate(times, [1] * len(times)), seconds

    def prefill(self, prompt_ids: Sequence[int], n_batch: int = 512, fa: int = 0) -> float:
        llm = self._context(False, fa, n_batch)
        llm.reset()
        start = time.perf_counter()
        llm.eval(list(prompt_ids))
        return time.perf_counter() - start


ENGINES = {"transformers": TransformersEngine, "llama.cpp": LlamaCppEngine}
MISSING_HINT = {
    "transformers": "pip install 'transformers>=5' accelerate",
    "llama.cpp": 'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
                 "pip install llama-cpp-python==0.3.36",
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
                                                       int(request["max_tokens"]), request.get("stop", []))
                _answer({"tokens": tokens, "tps": tps, "seconds": seconds})
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
