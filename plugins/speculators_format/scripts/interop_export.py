"""Write a random block drafter (with a draft vocabulary) and export it in the speculators format."""

import sys
from pathlib import Path

import numpy as np

from tsspec_gguf.gguf_writer import write_gguf
from tsspec_block.random_drafter import random_dflash_metadata, random_dflash_tensors
from tsspec_speculators_format.exporter import export_block

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
