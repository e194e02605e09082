"""Prefix-affinity routing through Ray Serve's own request-router interface.

``PrefixAffinityRouter`` sees each request's tokenized prompt (the ingress tokenizes before it
calls a replica). A request that extends a prompt some replica already served (the next turn of
a conversation: its prompt starts with the previous turn's whole prompt) goes to that replica,
where the prefix cache, the armed speculation and the draft memory are; any other request goes
to the least loaded replicas. A replica that died drops out of the table.
"""

from __future__ import annotations

from collections import deque
from typing import Any, List, Optional

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

__all__ = ["PrefixAffinityRouter", "prompt_of", "common_prefix"]

REMEMBERED = 256  # prompts remembered per replica (the oldest are forgotten first)
COVER = 0.9  # a remembered prompt counts when this share of it starts the new prompt


def prompt_of(request: PendingRequest | None) -> tuple[int, ...] | None:
    """The token ids of a request's prompt (the first argument's ``prompt_ids``), if any."""
    if request is None or not request.args:
        return None
    ids = getattr(request.args[0], "prompt_ids", None)
    return tuple(int(t) for t in ids) if ids is not None else None


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """See the module docstring."""

    def initialize_state(self, remembered: int = REMEMBERED, cover: float = COVER, **kwargs: Any) -> None:
        self._remembered = int(remembered)
        self._cover = float(cover)
        self._prompts: dict[ReplicaID, deque] = {}

    def _state(self) -> dict:
        if not hasattr(self, "_prompts"):
            self.initialize_state()
        return self._prompts

    def affinity(self, prompt: tuple[int, ...], candidates: List[RunningReplica]) -> Optional[RunningReplica]:
        """The candidate holding the longest remembered prompt that this one extends."""
        best, best_len = None, 0
        table = self._state()
        for replica in candidates:
            for seen in table.get(replica.replica_id, ()):
                shared = common_prefix(prompt, seen)
                if shared >= self._cover * len(seen) and shared > best_len:
                    best, best_len = replica, shared
        return best

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        prompt = prompt_of(pending_request)
        if prompt:
            sticky = self.affinity(prompt, candidate_replicas)
            if sticky is not None:
                return [[sticky]]
        cache = self.replica_queue_len_cache
        ranked = sorted(candidate_replicas, key=lambda r: (cache.get(r.replica_id) or 0, len(self._state().get(r.replica_id, ()))))
        return [ranked[:1], ranked[1:]] if len(ranked) > 1 else [ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        prompt = prompt_of(pending_request)
        if prompt:
            self._state().setdefault(replica_id, deque(maxlen=self._remembered)).append(prompt)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._state().pop(replica_id, None)
