"""tsspec under Ray Serve: engine replicas behind the serve plugin's OpenAI app.

Two deployments, as Ray Serve LLM lays out its own:

* ``EngineReplica`` (N replicas): a loaded target and a ``ServeEngine`` (the serve plugin's scheduler:
  continuous batching, prefix cache, a speculator per sequence). ``generate(prepared)`` streams
  a request's pieces; ``check_health`` is the engine's (a dead scheduler fails it). Routed by
  ``PrefixAffinityRouter`` (Ray's ``RequestRouter`` interface) on the tokenized prompt.
* ``Ingress`` (``@serve.ingress``): the serve plugin's FastAPI app, ``create_app``, over a
  ``ReplicaEngine`` that validates and tokenizes here and decodes on a replica. A request whose
  replica dies before its first streamed byte is retried on another; a stream cut later ends
  with an error event (the app's ``Done`` without a result), never with tokens of another run.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, AsyncIterator

import attrs
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import RayServeException

__all__ = ["EngineReplica", "Ingress", "ReplicaEngine", "build_app", "ROUTER"]

ROUTER = "tsspec_ray.router:PrefixAffinityRouter"
SERVED = 1024  # requests remembered with the replica that served them
RETRIES = 3  # attempts for a request whose replica died before it streamed anything
REPLICA_LOST = (RayActorError, RayServeException, ConnectionError)


@attrs.frozen
class Finished:
    """A replica's end of a request: what the app reads off a ``Done``'s handle."""

    state: str
    result: Any = None  # the Generation (None when failed or cancelled)
    error: BaseException | None = None
    replica: str = ""


def load_engine(model: str | None, engine_args: dict, spec: dict):
    """A started ServeEngine for ``model`` with the CLI's speculation flags (``spec``)."""
    from tsspec.cli import flags
    from tsspec.cli.generate_cmd import load_target
    from tsspec.cli.state import STATE
    from tsspec.runtime.defaults import default_catalog
    from tsspec_serve.engine import ServeEngine

    if STATE.catalog is None:
        STATE.catalog = default_catalog()
    options = flags.speculation_options(spec.get("spec"), spec.get("spec_type"), spec.get("spec_draft"),
                                        spec.get("spec_pmin"), spec.get("spec_draft_model"), None, spec.get("spec_adaptive"))
    target = load_target(model, "cpu", None, options)
    engine = ServeEngine(target, options=options, registry=STATE.catalog.speculators, **engine_args)
    return engine.start()


class EngineReplica:
    """One engine per replica (see the module docstring)."""

    def __init__(self, model: str | None = None, engine_args: dict | None = None, spec: dict | None = None):
        self.engine = load_engine(model, dict(engine_args or {}), dict(spec or {}))
        self.name = serve.get_replica_context().replica_tag if _in_serve() else "local"
        from ray.serve.metrics import Counter

        # Ray tags each series with its deployment and replica
        self._metrics = {k: Counter(f"tsspec_{k}", description=d) for k, d in (
            ("draft_tokens", "Tokens drafted."), ("accepted_tokens", "Drafted tokens the target accepted."),
            ("generation_tokens", "Tokens generated."), ("requests", "Requests finished."))}

    def info(self) -> dict:
        engine = self.engine
        import ray

        return {"model_id": engine.model_id, "context": engine.context, "replica": self.name,
                "architecture": engine.target.config.architecture,
                "model_context_length": engine.target.max_context_length, "context_label": engine.context_label,
                "actor": ray.get_runtime_context().get_actor_name()}

    def check_health(self) -> None:
        worker = getattr(self.engine.scheduler, "_thread", None)
        if worker is not None and not worker.is_alive():
            raise RuntimeError("the engine's scheduler thread has stopped")

    async def generate(self, prepared) -> AsyncIterator[tuple]:
        """("piece", token, text, logprobs) per piece, then ("done", Finished, draft memory
        counts). ``prepared.key``: the request's API key id (its draft pool on this replica)."""
        from tsspec_serve.engine import Done

        async for event in self.engine.run(prepared):
            if isinstance(event, Done):
                handle = event.handle
                self._count(handle.result)
                yield ("done", Finished(handle.state, handle.result, handle.error, self.name), event.memory)
                return
            yield ("piece", event.token, event.text, event.logprobs)

    def _count(self, result) -> None:
        counts = {"requests": 1}
        if result is not None:
            counts.update(generation_tokens=len(result.tokens), draft_tokens=result.stats.draft_tokens,
                          accepted_tokens=result.stats.accepted_tokens)
        for name, value in counts.items():
            if value > 0:  # Ray's counters take positive increments only
                self._metrics[name].inc(value)


def _in_serve() -> bool:
    try:
        serve.get_replica_context()
        return True
    except Exception:
        return False


class _Scheduler:
    """What the app reads off ``engine.scheduler``: this ingress's requests in flight."""

    def __init__(self):
        self.running = 0

    def snapshot(self) -> dict:
        return {"running": self.running, "waiting": 0}


class _Metrics:
    """The ingress's own counters; the replicas' spec metrics are Ray metrics (``tsspec_*``)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter

        self.registry = CollectorRegistry()
        self._errors = Counter("tsspec_ray_request_errors", "Requests refused (HTTP 4xx/5xx).", ["code"], registry=self.registry)
        self._retries = Counter("tsspec_ray_retries", "Requests retried on another replica.", registry=self.registry)

    def refused(self, status: int) -> None:
        self._errors.labels(str(status)).inc()

    def retried(self) -> None:
        self._retries.inc()

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class ReplicaEngine:
    """The ``ServeEngine`` surface the serve plugin's app uses, decoding on replicas."""

    def __init__(self, handle, *, tokenizer, model_id: str, context: int, architecture: str, options, spec_names,
                 model_context_length: int | None = None, context_label: str = "the model's context"):
        from tsspec_serve.scheduler import MAX_WINDOW

        self.handle = handle
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.options = options
        self.spec_names = list(spec_names)
        self.max_draft = MAX_WINDOW
        self.created = int(time.time())
        self._context = int(context)
        self.context_label = context_label
        # what the app reads off the target: its architecture and the model's own context length
        self.target = attrs.make_class("Target", {"config": attrs.field(), "max_context_length": attrs.field()})(
            attrs.make_class("Config", {"architecture": attrs.field()})(architecture),
            int(model_context_length if model_context_length is not None else context))
        self.scheduler = _Scheduler()
        self.metrics = _Metrics()
        self.served: deque = deque(maxlen=SERVED)  # (prompt ids, replica) of finished requests

    @property
    def context(self) -> int:
        return self._context

    def prepare_kwargs(self) -> dict[str, Any]:
        return dict(tokenizer=self.tokenizer, context=self.context, model_ids=[self.model_id],
                    default=self.options, spec_names=self.spec_names, max_draft=self.max_draft,
                    context_label=self.context_label)

    async def run(self, prepared) -> AsyncIterator[Any]:
        from tsspec_serve.engine import Done, Piece

        arrived = time.perf_counter()
        self.scheduler.running += 1
        try:
            for attempt in range(RETRIES):
                sent = False
                buffered: list = []
                try:
                    stream = self.handle.options(stream=True).generate.remote(prepared)
                    async for kind, *rest in stream:
                        if kind == "done":
                            self.served.append((tuple(prepared.prompt_ids), rest[0].replica))
                            for piece in buffered:
                                yield piece
                            yield Done(rest[0], None, arrived, rest[1] if len(rest) > 1 else None)
                            return
                        piece = Piece(*rest)
                        if prepared.stream:
                            sent = True
                            yield piece
                        else:
                            buffered.append(piece)  # a whole answer leaves only when complete
                except REPLICA_LOST as exc:
                    if sent or attempt == RETRIES - 1:
                        yield Done(Finished("failed", None, RuntimeError(f"the replica was lost mid-request: {type(exc).__name__}")), None, arrived)
                        return
                    self.metrics.retried()
                    await asyncio.sleep(0.2 * (attempt + 1))
        finally:
            self.scheduler.running -= 1


@serve.ingress()
class Ingress:
    """The serve plugin's FastAPI app in front of the engine replicas."""

    def __init__(self, replicas, model: str | None = None, spec: dict | None = None):
        self.replicas = replicas
        self.model = model
        self.spec = dict(spec or {})

    async def __serve_build_asgi_app__(self):
        from tsspec.cli import flags
        from tsspec.cli.state import STATE
        from tsspec.runtime.defaults import default_catalog
        from tsspec_serve.api import create_app

        if STATE.catalog is None:
            STATE.catalog = default_catalog()
        info = await self.replicas.info.remote()
        spec = self.spec
        options = flags.speculation_options(spec.get("spec"), spec.get("spec_type"), spec.get("spec_draft"),
                                            spec.get("spec_pmin"), spec.get("spec_draft_model"), None, spec.get("spec_adaptive"))
        engine = ReplicaEngine(self.replicas, tokenizer=load_tokenizer(self.model), model_id=info["model_id"],
                               context=info["context"], architecture=info["architecture"], options=options,
                               spec_names=STATE.catalog.speculators.names(),
                               model_context_length=info.get("model_context_length"),
                               context_label=info.get("context_label", "the model's context"))
        self.engine = engine
        return create_app(engine)

    def served(self) -> list[tuple[tuple[int, ...], str]]:
        """(prompt token ids, replica) of the requests finished lately, oldest first."""
        engine = getattr(self, "engine", None)
        return list(engine.served) if engine is not None else []


def load_tokenizer(model: str | None):
    """The model's tokenizer without its weights."""
    from tsspec_gguf.gguf_file import GGUFFile
    from tsspec_gguf.tokenizer import from_gguf

    if model is None:
        from tsspec_gguf.embedded import embedded_model_path

        model = str(embedded_model_path())
    with GGUFFile(model) as gf:
        tokenizer = from_gguf(gf)
    if tokenizer is None:
        raise ValueError(f"{model}: the model has no tokenizer: the server needs one")
    return tokenizer


def build_app(args: dict | None = None):
    """The Ray Serve application (an import path for Ray's config format: ``tsspec_ray.deployment:build_app``).
    ``args``: model, replicas, max_ongoing_requests, engine (ServeEngine keywords), spec (the
    ``--spec*`` flags by name), router (``PrefixAffinityRouter`` keywords)."""
    args = dict(args or {})
    model = args.get("model")
    replicas = int(args.get("replicas", 1))
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    spec = dict(args.get("spec") or {})
    engine_args = dict(args.get("engine") or {})
    router = RequestRouterConfig(request_router_class=ROUTER, request_router_kwargs=dict(args.get("router") or {}))
    replica = serve.deployment(
        EngineReplica, name="tsspec-engine", num_replicas=replicas,
        max_ongoing_requests=int(args.get("max_ongoing_requests", 32)),
        health_check_period_s=float(args.get("health_check_period_s", 2.0)),
        request_router_config=router, ray_actor_options={"num_cpus": float(args.get("replica_cpus", 0))},
    ).bind(model, engine_args, spec)
    ingress = serve.deployment(Ingress, name="tsspec-ingress", ray_actor_options={"num_cpus": 0})
    return ingress.bind(replica, model, spec)
