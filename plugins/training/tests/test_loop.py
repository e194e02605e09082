"""The shared training loop: seeded batches, and a run interrupted after a checkpoint resumes to
exactly the history of the uninterrupted run."""

from __future__ import annotations

import pytest
import torch

from tsspec_training.loop import LoopSpec, run

X = torch.randn(64, 6, generator=torch.Generator().manual_seed(1))
Y = X @ torch.randn(6, 1, generator=torch.Generator().manual_seed(2))


def _sample(step, generator):
    idx = torch.randint(64, (8,), generator=generator)
    return X[idx], Y[idx]


def _trainer(stop_at=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)

    def sample(step, generator):
        if stop_at is not None and step == stop_at:
            raise KeyboardInterrupt
        return _sample(step, generator)

    def loss(batch):
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y), {}

    return model, sample, loss


def test_loss_goes_down():
    model, sample, loss = _trainer()
    history = run(model, LoopSpec(steps=60, lr=0.05, warmup=2, log_every=0), sample, loss, log=lambda _: None)
    assert history[-1]["loss"] < 0.2 * history[0]["loss"]


def test_interrupted_run_resumes_to_the_same_history(tmp_path):
    spec = LoopSpec(steps=20, lr=0.05, warmup=2, log_every=0, checkpoint=None)
    model, sample, loss = _trainer()
    whole = run(model, spec, sample, loss, log=lambda _: None)

    ckpt = tmp_path / "ckpt.pt"
    spec = LoopSpec(steps=20, lr=0.05, warmup=2, log_every=0, checkpoint=str(ckpt), checkpoint_every=5)
    model, sample, loss = _trainer(stop_at=13)
    with pytest.raises(KeyboardInterrupt):
        run(model, spec, sample, loss, log=lambda _: None)
    assert torch.load(ckpt, weights_only=False)["step"] == 10
    model, sample, loss = _trainer()  # a fresh process: new module, resumed from the checkpoint
    resumed = run(model, spec, sample, loss, log=lambda _: None)
    assert [h["loss"] for h in resumed] == pytest.approx([h["loss"] for h in whole], rel=1e-6)


def test_a_checkpoint_of_another_schedule_is_refused(tmp_path):
    from tsspec.errors import OptionsError

    ckpt = tmp_path / "ckpt.pt"
    model, sample, loss = _trainer()
    run(model, LoopSpec(steps=5, log_every=0, checkpoint=str(ckpt)), sample, loss, log=lambda _: None)
    with pytest.raises(OptionsError, match="steps 5 vs 6"):
        run(model, LoopSpec(steps=6, log_every=0, checkpoint=str(ckpt)), sample, loss, log=lambda _: None)


def test_a_rate_scale_applies_to_the_named_parameters_only(tmp_path):
    model, sample, loss = _trainer()
    weight, bias = model.weight.detach().clone(), model.bias.detach().clone()
    spec = LoopSpec(steps=10, lr=0.05, warmup=2, log_every=0, lr_scales=(("weight", 0.0),),
                    checkpoint=str(tmp_path / "ckpt.pt"))
    run(model, spec, sample, loss, log=lambda _: None)
    assert torch.equal(model.weight, weight)  # rate 0: never moves
    assert not torch.equal(model.bias, bias)
    from tsspec.errors import OptionsError

    with pytest.raises(OptionsError, match="lr_scales"):  # another scale is another schedule
        run(model, LoopSpec(steps=10, lr=0.05, warmup=2, log_every=0, checkpoint=str(tmp_path / "ckpt.pt")),
            sample, loss, log=lambda _: None)
