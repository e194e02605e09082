"""Print the max relative logit error of the gemma4 plugin against transformers 5.25 on the
test suite's tiny random checkpoints: the trunk (prefill + decode + verify) and the MoE trunk
in float64 and float32, and three chained assistant steps, ordered embeddings off and on.

    python plugins/model_gemma4/scripts/parity.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import gemma4_tiny as tiny  # noqa: E402
from conftest import MOE  # noqa: E402
from gemma4_oracle import float64_oracle  # noqa: E402
from tsspec_model_gemma4.assistant import attach_assistant  # noqa: E402
from tsspec_model_gemma4.loader import load_gemma4  # noqa: E402

TOKENS = torch.randint(0, tiny.VOCAB, (16,), generator=torch.Generator().manual_seed(3)).tolist()


def rel(got, want) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


def main() -> None:
    root = Path(tempfile.mkdtemp())
    for label, model in (("trunk", tiny.hf_target()), ("moe trunk", tiny.hf_target(seed=2, **MOE))):
        path = tiny.write_target(model, root / "t.gguf")
        with float64_oracle(model), torch.no_grad():
            ref = model(torch.tensor([TOKENS]), use_cache=False).logits[0]
        for dtype in ("float64", "float32"):
            target = load_gemma4(path, {"dtype": dtype} if dtype == "float64" else None)
            rows = [target.spec_forward(TOKENS[:7], all_logits_rows=True, want_hidden=False)[0]]
            rows += [target.spec_forward([t], all_logits_rows=True, want_hidden=False)[0] for t in TOKENS[7:9]]
            rows.append(target.spec_forward(TOKENS[9:], all_logits_rows=True, want_hidden=False)[0])
            print(f"{label:10s} {dtype}: prefill 7 + decode 2 + verify 7, max rel err {rel(torch.cat(rows), ref):.2e}")
    model = tiny.hf_target()
    path = tiny.write_target(model, root / "t.gguf")
    for ordered in (False, True):
        assistant = tiny.hf_assistant(ordered=ordered)
        apath = tiny.write_assistant(assistant, root / "a.gguf")
        P, last = 11, TOKENS[11]
        with float64_oracle(model, assistant), torch.no_grad():
            out = model(torch.tensor([TOKENS[:P]]), use_cache=False, output_hidden_states=True,
                        return_shared_kv_states=True)
            shared = {k: (v[0][:, :, :P], v[1][:, :, :P]) for k, v in out.shared_kv_states.items()}
            h, tok, refs = out.hidden_states[-1][:, P - 1 : P], torch.tensor([[last]]), []
            for _ in range(3):
                o = assistant(inputs_embeds=torch.cat([model.model.embed_tokens(tok), h], -1),
                              position_ids=torch.tensor([[P]]), shared_kv_states=shared, use_cache=False)
                refs.append(o.logits[0, 0])
                h, tok = o.last_hidden_state, o.logits.argmax(-1)
        for dtype in ("float64", "float32"):
            target = load_gemma4(path, {"dtype": dtype} if dtype == "float64" else None)
            head = attach_assistant(target, apath)
            hid = target.spec_forward(TOKENS[:P], all_logits_rows=True, want_hidden=True)[1][-1]
            t, worst = last, 0.0
            for step in range(3):
                logits, hid = head.draft_step(t, hid, P + step)
                worst, t = max(worst, rel(logits, refs[step])), int(logits.argmax())
            print(f"assistant (ordered embeddings {'on' if ordered else 'off'}) {dtype}: 3 chained steps, "
                  f"max rel err {worst:.2e}")


if __name__ == "__main__":
    main()
