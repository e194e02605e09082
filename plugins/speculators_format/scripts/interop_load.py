"""Load tsspec exports with speculators' own classes; every tensor must match the file, the
mtp head's layer must compute what tsspec's head computed, and speculators' own save of it is
left for tsspec to read back (``head-resaved``)."""

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from speculators import SpeculatorModelConfig
from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
from speculators.models.mtp import MTPDraftModel, MTPSpeculatorConfig

work = Path(sys.argv[1])
VERSION = "0.9.0"

path = str(work / "spec")
config = SpeculatorModelConfig.from_pretrained(path)
assert isinstance(config, DFlashSpeculatorConfig), type(config)
model, info = DFlashDraftModel.from_pretrained(path, output_loading_info=True)
missing = [k for k in info["missing_keys"] if k not in ("embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight")]
assert not missing and not info["unexpected_keys"], info
state = model.state_dict()
for name, tensor in load_file(f"{path}/model.safetensors").items():
    assert torch.equal(state[name].to(tensor.dtype), tensor), name
d2t, t2d = state["d2t"], state["t2d"]
assert torch.equal(torch.arange(len(d2t)) + d2t, t2d.nonzero().flatten())
print(f"speculators {VERSION} loaded the export: "
      f"{type(config).__name__}, {type(model).__name__}, {len(info['missing_keys'])} verifier-owned tensors left to the verifier, "
      f"block {config.block_size}, draft vocabulary {config.draft_vocab_size}, aux layers {config.aux_hidden_state_layer_ids}")

path = str(work / "head-spec")
config = SpeculatorModelConfig.from_pretrained(path)
assert isinstance(config, MTPSpeculatorConfig), type(config)
model, info = MTPDraftModel.from_pretrained(path, output_loading_info=True)
missing = [k for k in info["missing_keys"] if k not in ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight")]
assert not missing and not info["unexpected_keys"], info
state = model.state_dict()
exported = load_file(f"{path}/model.safetensors")
for name, tensor in exported.items():
    assert torch.equal(state[name].to(tensor.dtype), tensor), name
ref = load_file(str(work / "head_reference.safetensors"))
n = ref["emb"].shape[0]
positions = torch.arange(n)[None]  # [1, n]
mask = torch.full((n, n), float("-inf")).triu(1)[None, None]  # causal, additive
with torch.no_grad():
    layer = model.mtp_layers[0].float()
    hidden = ref["hidden"][None]
    out = layer(hidden_states=hidden, token_embeddings=ref["emb"][None], attention_mask=mask, position_ids=positions,
                position_embeddings=model.rotary_emb(hidden, positions))[0]  # [n, H]
gap = float((out - ref["out"]).abs().max())
assert gap < 1e-4, gap
model.save_pretrained(str(work / "head-resaved"))
print(f"speculators {VERSION} loaded the export: {type(config).__name__}, {type(model).__name__} "
      f"({config.transformer_layer_config.model_type} layer), {len(exported)} tensors equal; its mtp layer's outputs "
      f"equal tsspec's head's on {n} rows (max gap {gap:.1e}); saved again by speculators")
