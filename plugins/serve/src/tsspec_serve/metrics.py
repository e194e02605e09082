"""Prometheus metrics of the server, under vLLM's names with a ``tsspec:`` prefix.

Speculation (summed over finished requests, from their ``SpecStats``):
``tsspec:spec_decode_num_drafts``, ``tsspec:spec_decode_num_draft_tokens``,
``tsspec:spec_decode_num_accepted_tokens``, ``tsspec:spec_decode_num_accepted_tokens_per_pos``
(label ``position``, 0-based), ``tsspec:governor_parked_steps``; counters are exposed with
``_total`` as Prometheus counters are. Requests: ``tsspec:request_success`` (label
``finished_reason``: stop, length, cancelled, failed), ``tsspec:prompt_tokens``,
``tsspec:generation_tokens``, the histograms ``tsspec:time_to_first_token_seconds`` and
``tsspec:inter_token_latency_seconds``. Scheduler gauges: ``tsspec:num_requests_running``,
``tsspec:num_requests_waiting``, ``tsspec:kv_cache_usage_perc``; the prefix cache:
``tsspec:prefix_cache_queries`` and ``tsspec:prefix_cache_hits`` (tokens) and
``tsspec:prefix_cache_hit_rate``; arming after prefix reuse: ``tsspec:spec_decode_armed_after_reuse``
(label ``decision``: armed, refused).

Gateway gauges: the Kubernetes Gateway API inference extension's model-server protocol reads
vLLM's ``vllm:num_requests_waiting`` (requests queued for admission), ``vllm:num_requests_running``
(sequences being decoded) and ``vllm:kv_cache_usage_perc`` (the fraction of KV blocks held by
sequences, 0 to 1); they are exposed under those names too, with the same values as the
``tsspec:`` gauges, so a router configured for vLLM reads this server unchanged.

Each server has its own registry (no process-global state), read at scrape time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

P = "tsspec:"
GATEWAY = "vllm:"  # the names the gateway inference extension reads by default
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _SchedulerCollector:
    """Reads the scheduler's counters and gauges when Prometheus scrapes."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def collect(self):
        snap = self.scheduler.snapshot()
        totals = snap["totals"]

        def counter(name, doc, value):
            family = CounterMetricFamily(P + name, doc)
            family.add_metric([], value)
            return family

        def gauge(name, doc, value, prefix=P):
            family = GaugeMetricFamily(prefix + name, doc)
            family.add_metric([], value)
            return family

        yield counter("spec_decode_num_drafts", "Drafts verified.", totals.drafts)
        yield counter("spec_decode_num_draft_tokens", "Draft tokens verified.", totals.draft_tokens)
        yield counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.", totals.accepted_tokens)
        per_pos = CounterMetricFamily(P + "spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted draft tokens by position in the draft.", labels=["position"])
        for position, count in enumerate(totals.accepted_per_position):
            per_pos.add_metric([str(position)], count)
        yield per_pos
        yield counter("governor_parked_steps", "Steps the cost governor ran plain while parked.", totals.governor_parked_steps)
        armed = CounterMetricFamily(P + "spec_decode_armed_after_reuse",
                                    "Speculation decisions after a reused KV prefix.", labels=["decision"])
        for decision, count in sorted(snap["arming"].items()):
            armed.add_metric([decision], count)
        yield armed
        usage = snap["kv_blocks_in_use"] / snap["kv_blocks_total"] if snap["kv_blocks_total"] else 0.0
        for prefix in (P, GATEWAY):
            yield gauge("num_requests_running", "Sequences being decoded.", snap["running"], prefix)
            yield gauge("num_requests_waiting", "Requests waiting for admission.", snap["waiting"], prefix)
            yield gauge("kv_cache_usage_perc", "Fraction of KV blocks held by sequences (1 = full).", usage, prefix)
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", snap["prefix_queried_tokens"])
        yield counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", snap["prefix_hit_tokens"])
        yield gauge("prefix_cache_hit_rate", "Hits over queries (tokens) since start.", snap["prefix_hit_rate"])


class ServerMetrics:
    """The server's registry: histograms fed by the engine, the rest read from the scheduler."""

    def __init__(self, scheduler):
        self.registry = CollectorRegistry()
        self.registry.register(_SchedulerCollector(scheduler))
        self._ttft = Histogram(P + "time_to_first_token_seconds", "Time to the first streamed token.",
                               buckets=TTFT_BUCKETS, registry=self.registry)
        self._itl = Histogram(P + "inter_token_latency_seconds", "Time between streamed tokens.",
                              buckets=ITL_BUCKETS, registry=self.registry)
        self._success = Counter(P + "request_success", "Finished requests.", ["finished_reason"], registry=self.registry)
        self._prompt = Counter(P + "prompt_tokens", "Prompt tokens of finished requests.", registry=self.registry)
        self._generated = Counter(P + "generation_tokens", "Tokens generated.", registry=self.registry)
        self._errors = Counter(P + "request_errors", "Requests refused (HTTP 4xx/5xx).", ["code"], registry=self.registry)

    def ttft(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def itl(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def refused(self, status: int) -> None:
        self._errors.labels(str(status)).inc()

    def finished(self, handle) -> None:
        result = handle.result
        if result is None:
            self._success.labels(handle.state).inc()  # cancelled or failed
            return
        self._success.labels("length" if result.finish_reason == "context" else result.finish_reason).inc()
        self._prompt.inc(result.prompt_tokens)
        self._generated.inc(len(result.tokens))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
