"""Random DSpark drafters for a converted DeepSeek V4 (tests and the benchmark), in each GGUF
convention the plugin reads. Stages are the model's MTP-slot block shape (sliding attention,
learned MoE, hyper-connections) with fresh random weights."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np


def _stage_template(tensors: dict[str, np.ndarray], layer: int) -> dict[str, np.ndarray]:
    prefix = f"blk.{layer}."
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix) and ".nextn." not in k
            and "compressor" not in k and "indexer" not in k and "tid2eid" not in k}


def random_dspark(arch_meta: dict[str, Any], tensors: dict[str, np.ndarray], *, convention: str = "embedded",
                  stages: int = 2, block: int = 4, rank: int = 8, head_type: str = "vanilla",
                  confidence: bool = True, confidence_with_markov: bool = True, sample_from_anchor: bool = True,
                  taps: tuple[int, ...] = (2, 4), noise_token_id: int = 1, seed: int = 0
                  ) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
    """(architecture, metadata, tensors). ``taps`` are HF target_layer_ids (layer outputs).
    'embedded': the trunk's file with the MTP block replaced by DSpark stages; 'sidecar': a
    ``deepseek4-dspark`` file; 'dflash': a ``dflash`` file with hyper-connections."""
    rng = np.random.default_rng(seed)
    a = "deepseek4"
    L = int(arch_meta[f"{a}.block_count"]) - int(arch_meta.get(f"{a}.nextn_predict_layers", 0))
    H = int(arch_meta[f"{a}.embedding_length"])
    V = int(arch_meta[f"{a}.vocab_size"])
    hc = int(arch_meta[f"{a}.hyper_connection.count"])
    # a learned-MoE layer to copy shapes from (the last trunk layer is never hash-routed here)
    template = _stage_template(tensors, L - 1)
    template = {k: v for k, v in template.items()}
    if "exp_probs_b.bias" not in template:
        template["exp_probs_b.bias"] = np.zeros(int(arch_meta[f"{a}.expert_count"]), np.float32)

    def draw(shape, fan_in=None, scale=1.0, centre=0.0):
        noise = rng.standard_normal(shape).astype(np.float32)
        if fan_in:
            noise /= math.sqrt(fan_in)
        return (centre + scale * noise).astype(np.float32)

    def like(name, value):
        if "norm" in name and value.ndim == 1:
            return draw(value.shape, scale=0.3, centre=1.0)
        if name.endswith("scale.weight"):
            return draw(value.shape, scale=0.2, centre=1.0)
        if value.ndim >= 2:
            return draw(value.shape, fan_in=value.shape[-1])
        return draw(value.shape, scale=0.3)

    first = L if convention == "embedded" else 0
    out: dict[str, np.ndarray] = {}
    for j in range(stages):
        for name, value in template.items():
            out[f"blk.{first + j}.{name}"] = like(name, value)
    head = {
        "fc.weight": draw((H, len(taps) * H), fan_in=len(taps) * H),
        "hidden_norm.weight": draw((H,), scale=0.3, centre=1.0),
        "output_norm.weight": draw((H,), scale=0.3, centre=1.0),
        "hc_head_fn.weight": draw((hc, hc * H), fan_in=hc * H),
        "hc_head_base.weight": draw((hc,), scale=0.3),
        "hc_head_scale.weight": draw((1,), scale=0.2, centre=1.0),
    }
    if rank:
        head["markov_w1"] = draw((V, rank))
        head["markov_w2"] = draw((V, rank), fan_in=rank, scale=2.0)
        if head_type == "gated":
            head["markov_gate.weight"] = draw((rank, H + rank), fan_in=H + rank)
            head["markov_gate.bias"] = draw((rank,), scale=0.3)
        elif head_type == "rnn":
            head["markov_joint.weight"] = draw((3 * rank, 2 * rank + H), fan_in=2 * rank + H)
            head["markov_joint.bias"] = draw((3 * rank,), scale=0.3)
    if confidence:
        width = H + (rank if confidence_with_markov else 0)
        head["confidence_proj"] = draw((1, width), fan_in=width)
        head["confidence_proj.bias"] = draw((1,), scale=0.3)
    keys = {"block_size": block, "markov_rank": rank, "markov_head_type": head_type,
            "enable_confidence_head": confidence, "confidence_head_with_markov": confidence_with_markov,
            "sample_from_anchor": sample_from_anchor}
    if convention == "dflash":
        rename = {"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight",
                  "output_norm.weight": "output_norm.weight"}
        for name, value in head.items():
            out[rename.get(name, "dspark." + name)] = value
        meta = {f"dflash.{k}": v for k, v in keys.items()}
        meta.update({"dflash.target_layers": [t + 1 for t in taps], "dflash.mask_token_id": noise_token_id,
                     "dflash.block_count": stages, "dflash.hyper_connection.count": hc,
                     "dflash.embedding_length": H})
        return "dflash", meta, out
    for name, value in head.items():
        out["dspark." + name] = value
    dmeta = {f"deepseek4.dspark.{k}": v for k, v in keys.items()}
    dmeta.update({"deepseek4.dspark.target_layer_ids": list(taps), "deepseek4.dspark.noise_token_id": noise_token_id,
                  "deepseek4.dspark.stage_count": stages})
    if convention == "sidecar":
        return "deepseek4-dspark", dmeta, out
    # embedded: the trunk's own tensors, its MTP block replaced by the stages
    trunk = {k: v for k, v in tensors.items() if not re.match(rf"^blk\.({'|'.join(str(i) for i in range(L, L + 8))})\.", k)}
    meta = dict(arch_meta)
    meta[f"{a}.block_count"] = L + stages
    meta[f"{a}.nextn_predict_layers"] = stages
    ratios = list(meta[f"{a}.attention.compress_ratios"])[:L] + [0] * stages
    meta[f"{a}.attention.compress_ratios"] = ratios
    if f"{a}.attention.indexer.types" in meta:
        meta[f"{a}.attention.indexer.types"] = list(meta[f"{a}.attention.indexer.types"])[:L] + [0] * stages
    meta.update(dmeta)
    return a, meta, {**trunk, **out}
