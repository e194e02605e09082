"""Read speculators' own save of the mtp export back with tsspec convert: the head's weights
must equal the original file's."""

import sys
from pathlib import Path

import torch

from tsspec_draft_head.nextn_file import read_nextn
from tsspec_speculators_format.reader import convert_speculators

work = Path(sys.argv[1])
kind = convert_speculators(work / "head-resaved", work / "head-back.gguf")
a, _, _ = read_nextn(str(work / "head.gguf"))
b, _, _ = read_nextn(str(work / "head-back.gguf"))
names = [name for name, _ in a.named_parameters()]
assert kind == "mtp" and all(torch.equal(getattr(a, n), getattr(b, n)) for n in names)
print(f"tsspec convert read speculators' save ({kind}) back: {len(names)} head tensors equal to the original")
