"""Write random tsspec drafters, export them in the speculators format, and keep what the
speculators side checks them against: a block drafter (with a draft vocabulary) and an
mtp-shaped NextN draft head (per-head q/k norms, the target's LM head), with the head's own
outputs on one causal sequence (``head_reference.safetensors``)."""

import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from tsspec_gguf.gguf_writer import write_gguf
from tsspec_block.random_drafter import random_dflash_metadata, random_dflash_tensors
from tsspec_draft_head.nextn_file import write_nextn
from tsspec_draft_head.nextn_model import NextNConfig, NextNModule
from tsspec_speculators_format.exporter import export_block, export_head

work = Path(sys.argv[1])
meta = random_dflash_metadata(hidden_size=64, target_layers=[1, 3], mask_token_id=5, num_layers=2, n_head=4,
                              n_head_kv=2, block_size=8, sliding_window=32, vocab_size=256)
tensors = random_dflash_tensors(meta, seed=0)
meta["draft_vocab"] = [int(i) for i in np.random.default_rng(1).permutation(256)[:48]]
tensors["output.weight"] = np.random.default_rng(2).standard_normal((48, 64)).astype(np.float32)
metadata = {"tokenizer.ggml.mask_token_id": meta.pop("__mask_token_id__")}
metadata.update({"dflash." + k: v for k, v in meta.items()})
write_gguf(work / "drafter.gguf", "dflash", metadata, tensors)
config = export_block(work / "drafter.gguf", work / "spec")
print(f"exported: speculators {config['speculators_model_type']}, draft vocabulary {config['draft_vocab_size']}")

# the draft head: random weights of the shape the trainer gives a Qwen3 target's whole-vocabulary head
cfg = NextNConfig(hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=2, head_dim=16, rms_eps=1e-6,
                  qk_norm=True, shared_head=True)
module = NextNModule(cfg, 256)
g = torch.Generator().manual_seed(3)
with torch.no_grad():
    for name, p in module.named_parameters():
        p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g) if p.dim() == 1
                else torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
write_nextn(work / "head.gguf", module, target={"architecture": "llama", "vocab_size": 256}, outtype="f32")
config = export_head(work / "head.gguf", work / "head-spec", verifier_layers=4)
n = 9
emb, hidden = torch.randn(n, 64, generator=g), torch.randn(n, 64, generator=g)  # [n, H]
positions = torch.arange(n)
with torch.no_grad():
    u = module.inputs(emb, hidden)
    q, k, v = module.qkv(u, positions)
    out = module.finish(u, module.attend(q[None], k[None], v[None], torch.ones(n, n).tril().bool())[0])  # [n, H]
save_file({"emb": emb, "hidden": hidden, "out": out.contiguous()}, str(work / "head_reference.safetensors"))
print(f"exported: speculators {config['speculators_model_type']} "
      f"({config['transformer_layer_config']['model_type']} layer, hidden {cfg.hidden_size})")
