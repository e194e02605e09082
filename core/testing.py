"""A testing kit for plugin authors and tsspec's own tests: ``ToyTarget`` (an exact tiny model
with a KV cache and a recurrent state), fake speculators (oracle, random, adversarial),
``assert_lossless``, ``plugin_catalog``, and helpers that run two sequences interleaved to
show a draft head's per-sequence views keep them apart."""

from __future__ import annotations

import math
import random
import threading
import time
from typing import Callable, Sequence

import torch

from .protocols import DraftContext, ModelConfig, resolve_feature_taps
from .runtime.options import SpeculationOptions
from .runtime.sampling import SamplingParams


_TOY_ALPHABET = "abcdefghijklmnopqrstuvwxyz .,!?\n"  # 32 symbols: one id each


class ToyTokenizer:
    """One character per id over a 32-symbol alphabet, so the toy can be driven with text."""

    bos_token_id = None
    eos_token_ids: frozenset[int] = frozenset()

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        space = _TOY_ALPHABET.index(" ")
        return [
            (_TOY_ALPHABET.index(c) if c in _TOY_ALPHABET else space) % self.vocab_size
            for c in text.lower()
        ]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return "".join(_TOY_ALPHABET[int(i) % len(_TOY_ALPHABET)] for i in ids)

    def apply_chat_template(self, messages, *, add_generation_prompt: bool = True) -> str:
        return "\n".join(m["content"] for m in messages) + ("\n" if add_generation_prompt else "")


class ToyTarget:
    """An exact toy trunk: embedding -> attention (KV cache) -> tanh RNN -> logits, float64, one row
    at a time (so a verify is bit-identical to one-row decoding).

    ``per_row_snapshots``: a hybrid with per-row state slots that ``spec_keep`` commits; else a
    verify saves its start state and a kept prefix is restored and re-forwarded.
    ``recurrent=False``: pure KV."""

    def __init__(
        self,
        vocab_size: int = 32,
        hidden_size: int = 16,
        *,
        seed: int = 0,
        per_row_snapshots: bool = False,
        recurrent: bool = True,
        max_context: int = 512,
        sharpness: float = 4.0,
        forward_delay_s: float = 0.0,
    ):
        g = torch.Generator().manual_seed(seed)
        H, V = hidden_size, vocab_size

        def w(*shape, scale=1.0):
            return torch.randn(*shape, generator=g, dtype=torch.float64) * scale / math.sqrt(shape[0])

        self.emb = torch.randn(V, H, generator=g, dtype=torch.float64)  # [V, H]
        self.wq, self.wk, self.wv, self.wo = (w(H, H) for _ in range(4))  # [H, H]
        self.rnn_a, self.rnn_b, self.rnn_o = w(H, H, scale=0.9), w(H, H), w(H, H)
        self.w_out = w(H, V, scale=sharpness)  # [H, V]
        self.recurrent = recurrent
        self.per_row_snapshots = per_row_snapshots and recurrent
        self.forward_delay_s = forward_delay_s  # simulate a slower trunk (governor tests)
        self.config = ModelConfig("toy", V, H, 2 if recurrent else 1, max_context)
        self.tokenizer = ToyTokenizer(V)
        self.draft_head = None
        self.speculation_profitable = True
        self.speculation_refusal = None
        self.spec_preferred_draft_window = None
        self.spec_verify_persists_accepted_kv = not recurrent
        self._max_context = max_context
        self._capacity = 0
        self._keys = torch.zeros(0, H, dtype=torch.float64)  # [capacity, H]
        self._values = torch.zeros(0, H, dtype=torch.float64)  # [capacity, H]
        self._len = 0
        self._state = torch.zeros(H, dtype=torch.float64)  # live recurrent state [H]
        self._saved_state: torch.Tensor | None = None  # [H] the state a verify started from
        self._last: tuple[int, list[int]] = (0, [])  # (start, tokens) of the last forward
        self._slots: torch.Tensor | None = None  # [rows, H] per-row states of the last forward
        self._taps: tuple[int, ...] | None = None
        self.forward_calls = 0
        self.forward_rows = 0

    @property
    def cache_seq_len(self) -> int:
        return self._len

    @property
    def max_context_length(self) -> int:
        return self._max_context

    @property
    def spec_feature_size(self) -> int:
        n = len(self._taps) if self._taps else 1
        return n * self.config.hidden_size

    def embed(self, ids: Sequence[int]) -> torch.Tensor:
        return self.emb[torch.as_tensor(list(ids), dtype=torch.long)]  # [n, H]

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return h

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return h.to(torch.float64) @ self.w_out  # [n, V]

    def spec_set_feature_taps(self, layers: Sequence[int] | None) -> None:
        self._taps = resolve_feature_taps(layers, self.config.num_layers)

    def spec_ensure_capacity(self, required_seq_len: int) -> None:
        if required_seq_len > self._max_context:
            raise ValueError(f"{required_seq_len} rows exceed the context of {self._max_context}")
        if required_seq_len > self._capacity:
            cap = min(self._max_context, max(required_seq_len, 2 * self._capacity, 16))
            H = self.config.hidden_size
            for name in ("_keys", "_values"):
                grown = torch.zeros(cap, H, dtype=torch.float64)
                grown[: self._len] = getattr(self, name)[: self._len]
                setattr(self, name, grown)
            self._capacity = cap

    def _row(self, token: int, pos: int, state: torch.Tensor):
        """One row: (final hidden [H], residuals entering each layer, state)."""
        x = self.emb[token]
        entering = [x]
        q, k, v = x @ self.wq, x @ self.wk, x @ self.wv
        self._keys[pos], self._values[pos] = k, v
        keys, values = self._keys[: pos + 1], self._values[: pos + 1]
        att = torch.softmax(keys @ q / math.sqrt(q.shape[0]), dim=0)
        x = x + (att @ values) @ self.wo
        if self.recurrent:
            entering.append(x)
            state = torch.tanh(state @ self.rnn_a + x @ self.rnn_b)
            x = x + state @ self.rnn_o
        entering.append(x)
        return x, entering, state

    def spec_forward(self, tokens: Sequence[int], *, all_logits_rows: bool, want_hidden: bool):
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("spec_forward needs at least one token")
        start = self._len
        self.spec_ensure_capacity(start + len(tokens))
        if self.forward_delay_s:
            time.sleep(self.forward_delay_s)
        # a verify on the restore path saves the state it starts from (spec_keep may need it)
        self._saved_state = self._state.clone() if all_logits_rows and not self.per_row_snapshots else None
        hiddens, features, states = self._rows(tokens, start)
        self._last = (start, tokens)
        if self.per_row_snapshots:
            self._slots = torch.stack(states)  # the live state stays the pre-forward state
        else:
            self._state = states[-1]
        h_all = torch.stack(hiddens)  # [rows, H]
        logits = self.lm_head(h_all if all_logits_rows else h_all[-1:])
        hidden = None
        if want_hidden:
            hidden = torch.stack(features) if self._taps else h_all
        return logits, hidden

    def _rows(self, tokens: list[int], start: int):
        """Run ``tokens`` at ``start ..`` from the live state; advance the length."""
        self.forward_calls += 1
        self.forward_rows += len(tokens)
        state = self._state
        hiddens, features, states = [], [], []
        for i, tok in enumerate(tokens):
            h, entering, state = self._row(tok, start + i, state)
            hiddens.append(h)
            states.append(state)
            if self._taps:
                features.append(torch.cat([entering[l] for l in self._taps]))
        self._len = start + len(tokens)
        return hiddens, features, states

    def spec_keep(self, rows_kept: int) -> str | None:
        start, tokens = self._last
        if not 1 <= rows_kept <= len(tokens):
            raise ValueError(f"cannot keep {rows_kept} rows of a forward of {len(tokens)}")
        if self.per_row_snapshots:  # commit the kept row's state slot
            self._state = self._slots[rows_kept - 1].clone()
            self._len = start + rows_kept
            self._slots = None
            return "committed"
        if rows_kept == len(tokens) or not self.recurrent:
            self._len = start + rows_kept  # a KV rewind is the whole rollback
            return None
        if self._saved_state is None:
            raise ValueError("keeping a prefix of a recurrent forward needs a verify (all_logits_rows=True)")
        self._state, self._saved_state = self._saved_state, None  # restore, then re-forward
        self._len = start
        self._state = self._rows(tokens[:rows_kept], start)[2][-1]
        return "reforward"

    def spec_rewind_cache(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot rewind to {length}: the cache holds {self._len}")
        self._len = length
        if length == 0:
            self._state = torch.zeros_like(self._state)
            self._saved_state = None

    def state_fingerprint(self) -> tuple:
        """Cache length, live K/V rows and recurrent state."""
        n = self._len
        return (n, self._keys[:n].clone(), self._values[:n].clone(), self._state.clone())


def plain_tokens(
    target, prompt: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None
) -> list[int]:
    """The plain (non-speculative) continuation of ``prompt``."""
    from .runtime.generation import generate

    return generate(
        target, list(prompt), SpeculationOptions(enabled=False), max_tokens=max_tokens, sampling=sampling
    ).tokens


class OracleSpeculator:
    """Proposes the plain continuation, each token corrupted with probability ``corrupt``."""

    name = "oracle"
    can_arm_after_prefix_reuse = True

    def __init__(self, sequence: Sequence[int], *, corrupt: float = 0.0, vocab_size: int, max_draft_tokens: int = 8, seed: int = 0):
        self.sequence = [int(t) for t in sequence]  # prompt + plain continuation
        self.corrupt = corrupt
        self.vocab_size = vocab_size
        self.max_draft_tokens = max_draft_tokens
        self.seed = seed
        self.proposals = 0
        self.commits = 0

    @classmethod
    def from_plain_run(cls, target, prompt, max_tokens, *, sampling=None, corrupt=0.0, max_draft_tokens=8, seed=0):
        cont = plain_tokens(target, prompt, max_tokens, sampling)
        return cls(list(prompt) + cont, corrupt=corrupt, vocab_size=target.config.vocab_size,
                   max_draft_tokens=max_draft_tokens, seed=seed)

    def propose(self, ctx: DraftContext) -> list[int]:
        self.proposals += 1
        p = ctx.position
        if list(ctx.history[-8:]) != self.sequence[max(0, p - 7) : p + 1]:
            return []  # off the reference path (cannot happen when verification is right)
        out = []
        for i, tok in enumerate(self.sequence[p + 1 : p + 1 + min(ctx.max_tokens, self.max_draft_tokens)]):
            rng = random.Random((self.seed * 1_000_003 + p) * 131 + i)
            if rng.random() < self.corrupt:
                tok = (tok + 1 + rng.randrange(self.vocab_size - 1)) % self.vocab_size
            out.append(tok)
        return out

    def commit(self, tokens, hidden_rows, start_pos) -> None:
        self.commits += 1


class SilentSpeculator:
    """The least a speculator is: ``name`` and a ``propose`` that never drafts."""

    def __init__(self, name: str):
        self.name = name

    def propose(self, ctx: DraftContext) -> list[int]:
        return []

    def __eq__(self, other) -> bool:
        return isinstance(other, SilentSpeculator) and other.name == self.name

    __hash__ = None


class RandomSpeculator:
    """Proposes random ids: acceptance near 1/vocab."""

    name = "random"
    needs_hidden_state = True  # exercises the hidden-row plumbing too
    can_arm_after_prefix_reuse = True

    def __init__(self, vocab_size: int, *, max_draft_tokens: int = 4, seed: int = 0):
        self.vocab_size = vocab_size
        self.max_draft_tokens = max_draft_tokens
        self.rng = random.Random(seed)
        self.committed: list[tuple[int, int]] = []  # (start_pos, n) of each commit

    def propose(self, ctx: DraftContext) -> list[int]:
        n = self.rng.randint(0, min(ctx.max_tokens, self.max_draft_tokens))
        return [self.rng.randrange(self.vocab_size) for _ in range(n)]

    def commit(self, tokens, hidden_rows, start_pos) -> None:
        if hidden_rows is not None and hidden_rows.shape[0] != len(tokens):
            raise AssertionError("hidden rows do not pair with tokens")
        self.committed.append((start_pos, len(tokens)))

    def reset(self) -> None:
        self.committed.clear()


ADVERSARIAL_MODES = tuple(
    "out_of_vocab negative too_many wrong_type floats raise_propose raise_commit none slow mixed".split()
)


class AdversarialSpeculator:
    """Misbehaves on purpose (``mode`` in ADVERSARIAL_MODES); "mixed" cycles through them,
    interleaved with correct drafts when ``sequence`` is given."""

    name = "adversarial"
    can_arm_after_prefix_reuse = True

    def __init__(self, vocab_size: int, mode: str = "mixed", *, sequence: Sequence[int] | None = None,
                 max_draft_tokens: int = 4, delay_s: float = 0.002):
        if mode not in ADVERSARIAL_MODES:
            raise ValueError(f"unknown mode {mode!r}")
        self.vocab_size = vocab_size
        self.mode = mode
        self.sequence = list(sequence) if sequence is not None else None
        self.max_draft_tokens = max_draft_tokens
        self.delay_s = delay_s
        self.calls = 0

    def _behave(self, mode: str, ctx: DraftContext):
        v = self.vocab_size
        if mode == "raise_propose":
            raise RuntimeError("adversarial propose")
        if mode == "slow":
            time.sleep(self.delay_s)
            return [ctx.last_token] * min(2, ctx.max_tokens)
        bad = {"out_of_vocab": [v, v + 7], "negative": [-1], "wrong_type": "not a list", "floats": [1.5, math.nan]}
        return [0] * 1_000_000 if mode == "too_many" else None if mode == "none" else bad.get(mode, [])

    def propose(self, ctx: DraftContext):
        self.calls += 1
        mode = self.mode
        if mode == "mixed":
            kinds = [m for m in ADVERSARIAL_MODES if m not in ("mixed", "slow", "raise_commit")]
            if self.sequence is not None and self.calls % 2 == 0:
                p = ctx.position
                return self.sequence[p + 1 : p + 1 + min(ctx.max_tokens, self.max_draft_tokens)]
            mode = kinds[self.calls % len(kinds)]
        return self._behave(mode, ctx)

    def commit(self, tokens, hidden_rows, start_pos) -> None:
        if self.mode == "raise_commit":
            raise RuntimeError("adversarial commit")

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


def assert_lossless(
    make_target: Callable[[], object],
    make_speculator: Callable[[object], object],
    prompt: Sequence[int] | str,
    *,
    max_tokens: int = 32,
    sampling: SamplingParams | None = None,
    options: SpeculationOptions | None = None,
    check_state: bool = True,
):
    """Plain and speculative decoding on fresh targets: identical tokens and (with
    ``state_fingerprint``) trunk state. Returns both Generations."""
    from .runtime.generation import generate

    plain_target = make_target()
    plain = generate(plain_target, prompt, SpeculationOptions(enabled=False), max_tokens=max_tokens, sampling=sampling)
    spec_target = make_target()
    speculator = make_speculator(spec_target)
    opts = options or SpeculationOptions(adaptive=False)
    spec = generate(spec_target, prompt, opts, max_tokens=max_tokens, sampling=sampling, speculator=speculator)
    assert spec.tokens == plain.tokens, (
        f"speculative output differs from plain:\n plain={plain.tokens}\n  spec={spec.tokens}"
    )
    if check_state and hasattr(plain_target, "state_fingerprint"):
        a, b = plain_target.state_fingerprint(), spec_target.state_fingerprint()
        assert a[0] == b[0], f"cache length differs: plain {a[0]} spec {b[0]}"
        for x, y in zip(a[1:], b[1:]):
            assert torch.equal(x, y), "trunk state after generation differs from the plain run"
    return plain, spec


def turns(target, speculator, prompts: Sequence[Sequence[int]], *, max_tokens: Sequence[int],
          sampling: SamplingParams | None = None, window: int = 8) -> list:
    """Run ``prompts`` through ONE loop on ``target`` as a chat's turns (a prompt that extends the
    cache reuses that prefix); (tokens, stats) per prompt."""
    from .runtime.execution import SpeculativeExecution
    from .runtime.sampling import Sampler

    loop = SpeculativeExecution(target, Sampler(sampling or SamplingParams()), vocab_size=target.config.vocab_size,
                                speculator=speculator, window=window)
    return [(loop.run(list(prompt), n), loop.stats) for prompt, n in zip(prompts, max_tokens)]


def plugin_catalog(plugins: dict, *, disabled: Sequence[str] = ()):
    """The catalog the plugin host builds from ``plugins`` ({name: module}) alone."""
    from .plugins import PluginControls, PluginHost
    from .runtime.catalog import build_catalog

    host = PluginHost(PluginControls.resolve(cli_disable=list(disabled)))
    for name, module in plugins.items():
        host.register(module, name)
    return build_catalog(host, discover=False)


class TakingTurns:
    """Two sequences whose calls through ``run`` interleave one by one (until one finishes)."""

    def __init__(self, timeout_s: float = 60.0):
        self._cond = threading.Condition()
        self._turn = 0
        self._done: set[int] = set()
        self.timeout_s = timeout_s

    def run(self, who: int, fn, *args):
        with self._cond:
            if not self._cond.wait_for(lambda: self._turn == who or (1 - who) in self._done, timeout=self.timeout_s):
                raise TimeoutError(f"sequence {who} waited over {self.timeout_s} s for its turn")
        try:
            return fn(*args)
        finally:
            with self._cond:
                self._turn = 1 - who
                self._cond.notify_all()

    def finish(self, who: int) -> None:
        with self._cond:
            self._done.add(who)
            self._cond.notify_all()


class RecordingSpeculator:
    """Records a speculator's proposals; with ``turns``, runs its calls in sequence ``who``'s turn."""

    def __init__(self, inner, turns: TakingTurns | None = None, who: int = 0):
        self.inner, self.turns, self.who, self.proposals = inner, turns, who, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _call(self, fn, *args):
        return fn(*args) if self.turns is None else self.turns.run(self.who, fn, *args)

    def propose(self, ctx):
        drafts = self._call(self.inner.propose, ctx)
        self.proposals.append(list(drafts))
        return drafts

    def commit(self, tokens, hidden_rows, start_pos):
        return self._call(self.inner.commit, tokens, hidden_rows, start_pos)


class WithoutViews:
    """A draft head minus ``for_sequence`` (one shared sequence state)."""

    def __init__(self, head):
        self._head = head

    def __getattr__(self, name):
        if name == "for_sequence":
            raise AttributeError(name)
        return getattr(self._head, name)


def factory_without_views(make: Callable) -> Callable:
    """``make`` building over the target's draft head with its ``for_sequence`` hidden."""

    def build(target):
        real = target.draft_head
        target.draft_head = WithoutViews(real)
        try:
            return make(target)
        finally:
            target.draft_head = real

    return build


def _record(target, prompt, options, max_tokens, sampling, speculator) -> dict:
    from .runtime.generation import generate

    out = generate(target, list(prompt), options, max_tokens=max_tokens, sampling=sampling, speculator=speculator)
    return {"tokens": list(out.tokens), "proposals": speculator.proposals,
            "accepted": out.stats.accepted_tokens, "drafted": out.stats.draft_tokens}


def sequences_alone(targets, prompts, make: Callable, options: SpeculationOptions, *, max_tokens: int,
                    sampling: SamplingParams | None = None) -> list[dict]:
    """Each prompt on its target, one after the other: {"tokens", "proposals", "accepted", "drafted"}."""
    return [_record(t, p, options, max_tokens, sampling, RecordingSpeculator(make(t))) for t, p in zip(targets, prompts)]


def sequences_interleaved(targets, prompts, make: Callable, options: SpeculationOptions, *, max_tokens: int,
                          sampling: SamplingParams | None = None, timeout_s: float = 120.0) -> list[dict]:
    """Two sequences in two threads whose speculators' calls take turns (records as ``sequences_alone``)."""
    if len(targets) != 2 or len(prompts) != 2:
        raise ValueError("sequences_interleaved takes two targets and two prompts")
    turns, results, errors = TakingTurns(), [None, None], []

    def one(who: int) -> None:
        try:
            spec = RecordingSpeculator(make(targets[who]), turns, who)
            results[who] = _record(targets[who], prompts[who], options, max_tokens, sampling, spec)
        except BaseException as exc:  # re-raised by the calling thread
            errors.append(exc)
        finally:
            turns.finish(who)

    threads = [threading.Thread(target=one, args=(who,)) for who in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if errors:
        raise errors[0]
    return results


def assert_views_keep_sequences_apart(targets, prompts, make, options: SpeculationOptions, *, max_tokens: int,
                                      sampling: SamplingParams | None = None) -> None:
    """Interleaved sequences draft and accept exactly what each does alone, and equal plain decoding."""
    from .runtime.generation import generate

    alone = sequences_alone(targets, prompts, make, options, max_tokens=max_tokens, sampling=sampling)
    both = sequences_interleaved(targets, prompts, make, options, max_tokens=max_tokens, sampling=sampling)
    plain_options = SpeculationOptions(enabled=False)
    for who, (solo, mixed) in enumerate(zip(alone, both)):
        plain = generate(targets[who], list(prompts[who]), plain_options, max_tokens=max_tokens, sampling=sampling)
        assert solo["tokens"] == mixed["tokens"] == list(plain.tokens)  # lossless either way
        assert mixed["proposals"] == solo["proposals"], f"sequence {who} drafted differently beside the other"
        assert (mixed["accepted"], mixed["drafted"]) == (solo["accepted"], solo["drafted"])
        assert solo["drafted"] > 0
