"""Write tsspec drafters, export them in the speculators format, and keep what the speculators
side checks them against: a random block drafter (with a draft vocabulary) and a NextN draft
head trained on a tiny qwen3 (per-head q/k norms, the target's LM head: speculators' mtp), with
the head's own outputs on one causal sequence (``head_reference.safetensors``)."""

import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from tsspec_gguf.gguf_writer import write_gguf
from tsspec_block.random_drafter import random_dflash_metadata, random_dflash_tensors
from tsspec_draft_head.nextn_file import read_nextn
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

# the draft head: trained by the mtp trainer on a tiny qwen3 (the test suite's own helper)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_head import LAYERS, train_tiny_head  # noqa: E402

model, head = train_tiny_head(work)
config = export_head(head, work / "head-spec", verifier_layers=LAYERS)
module, _, _ = read_nextn(head)
cfg = module.cfg
g = torch.Generator().manual_seed(3)
n = 9
emb, hidden = torch.randn(n, cfg.hidden_size, generator=g), torch.randn(n, cfg.hidden_size, generator=g)  # [n, H]
positions = torch.arange(n)
with torch.no_grad():
    u = module.inputs(emb, hidden)
    q, k, v = module.qkv(u, positions)
    out = module.finish(u, module.attend(q[None], k[None], v[None], torch.ones(n, n).tril().bool())[0])  # [n, H]
save_file({"emb": emb, "hidden": hidden, "out": out.contiguous()}, str(work / "head_reference.safetensors"))
print(f"exported: speculators {config['speculators_model_type']} of a trained head "
      f"({config['transformer_layer_config']['model_type']} layer, hidden {cfg.hidden_size})")
