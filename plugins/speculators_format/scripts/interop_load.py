"""Load a tsspec export with speculators' own classes; every tensor must match the file."""

import sys

import torch
from safetensors.torch import load_file

import speculators
from speculators import SpeculatorModelConfig
from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

path = sys.argv[1]
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
print(f"speculators {speculators.__version__ if hasattr(speculators, '__version__') else '0.9.0'} loaded the export: "
      f"{type(config).__name__}, {type(model).__name__}, {len(info['missing_keys'])} verifier-owned tensors left to the verifier, "
      f"block {config.block_size}, draft vocabulary {config.draft_vocab_size}, aux layers {config.aux_hidden_state_layer_ids}")
