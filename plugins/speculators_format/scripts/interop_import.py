"""Read speculators' own save of the mtp export back with tsspec convert: the head's weights
must equal the original file's, and its drafts the original's on 20 prompts."""

import sys
from pathlib import Path

import torch

from tsspec.runtime.loading import load_model
from tsspec_draft_head.nextn_file import read_nextn
from tsspec_speculators_format.reader import convert_speculators

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_head import chain, prompts  # noqa: E402

work = Path(sys.argv[1])
kind = convert_speculators(work / "head-resaved", work / "head-back.gguf")
a, _, _ = read_nextn(str(work / "head.gguf"))
b, _, _ = read_nextn(str(work / "head-back.gguf"))
names = [name for name, _ in a.named_parameters()]
assert kind == "mtp" and all(torch.equal(getattr(a, n), getattr(b, n)) for n in names)
model = str(work / "tiny-qwen3.gguf")
with_original = load_model(model, draft_model=str(work / "head.gguf"))
with_back = load_model(model, draft_model=str(work / "head-back.gguf"))
original = [chain(with_original, p) for p in prompts()]
back = [chain(with_back, p) for p in prompts()]
assert back == original
print(f"tsspec convert read speculators' save ({kind}) back: {len(names)} head tensors equal to the trained "
      f"head's, drafts identical on {len(original)} prompts")
