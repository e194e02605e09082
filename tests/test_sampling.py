"""Sampling: greedy, filters, repetition penalty, and the position-seeded draw."""

import pytest
import torch

from tsspec.runtime.sampling import Sampler, SamplingParams, position_uniform


def test_greedy_is_argmax():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert Sampler().sample(logits, 5, []) == 1


def test_draw_depends_only_on_seed_position_and_logits():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    s = Sampler(SamplingParams(temperature=1.0, seed=42))
    draws = [s.sample(logits, p, []) for p in range(200)]
    again = [Sampler(SamplingParams(temperature=1.0, seed=42)).sample(logits, p, [1, 2]) for p in range(200)]
    assert draws == again  # no hidden RNG state: same (seed, position, logits) -> same token
    other = [Sampler(SamplingParams(temperature=1.0, seed=43)).sample(logits, p, []) for p in range(200)]
    assert draws != other
    assert len(set(draws)) > 5  # it really samples


def test_uniform_range_and_spread():
    us = [position_uniform(3, p) for p in range(5000)]
    assert all(0.0 <= u < 1.0 for u in us)
    assert abs(sum(us) / len(us) - 0.5) < 0.02


def test_sampled_frequencies_follow_probabilities():
    logits = torch.log(torch.tensor([0.7, 0.2, 0.1]))
    s = Sampler(SamplingParams(temperature=1.0, seed=1))
    counts = [0, 0, 0]
    for p in range(4000):
        counts[s.sample(logits, p, [])] += 1
    assert abs(counts[0] / 4000 - 0.7) < 0.03 and abs(counts[2] / 4000 - 0.1) < 0.02


@pytest.mark.parametrize(
    "params, allowed",
    [
        (SamplingParams(temperature=1.0, top_k=2), {0, 1}),
        (SamplingParams(temperature=1.0, top_p=0.5), {0}),
        (SamplingParams(temperature=1.0, min_p=0.5), {0, 1}),
    ],
)
def test_filters(params, allowed):
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    s = Sampler(params)
    assert {s.sample(logits, p, []) for p in range(300)} <= allowed


def test_repetition_penalty_llama_cpp_semantics():
    s = Sampler(SamplingParams(repeat_penalty=2.0))
    logits = torch.tensor([4.0, -2.0, 3.0])
    out = s.adjust(logits, [0, 1])
    assert out.tolist() == [2.0, -4.0, 3.0]  # positive divided, negative multiplied
    assert s.sample(logits, 0, [0]) == 2  # token 0 penalised below token 2


def test_invalid_params():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top-p"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="repeat-penalty"):
        SamplingParams(repeat_penalty=0)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(repeat_penalty=1.3, repeat_last_n=0),
        SamplingParams(repeat_penalty=1.3, repeat_last_n=8),
        SamplingParams(temperature=0.7, repeat_penalty=1.0, repeat_last_n=64),
    ],
)
def test_a_lookback_of_zero_means_the_adjustment_changes_nothing(params):
    """DraftContext.adjust_lookback's contract: 0 lets a drafter skip adjust_logits."""
    sampler = Sampler(params)
    logits = torch.linspace(-3.0, 3.0, 16)  # [vocab] with both signs
    adjusted = sampler.adjust(logits, [1, 2, 3, 15])
    if sampler.lookback == 0:
        assert torch.equal(adjusted, logits)
    else:
        assert not torch.equal(adjusted, logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_greedy_token_is_torchs_argmax_ties_nans_and_views_included(dtype):
    from tsspec.runtime.sampling import greedy_token

    g = torch.Generator().manual_seed(5)
    rows = torch.randn(6, 49152, generator=g).to(dtype)
    rows[1, 7] = rows[1, 900] = rows[1].max() + 1  # a tie: the first index wins
    rows[2, 31] = rows[2, 4000] = float("nan")  # NaN counts as the largest, the first one
    rows[3] = float("-inf")  # all equal: index 0
    rows[4, -1] = float("inf")
    strided = torch.randn(2, 3000, generator=g).to(dtype).t()[:, 1]  # a non-contiguous view
    for row in [*rows, strided]:
        assert greedy_token(row) == int(torch.argmax(row).item())
    assert greedy_token(rows[1]) == 7 and greedy_token(rows[2]) == 31 and greedy_token(rows[3]) == 0


def test_greedy_token_reads_a_row_with_the_negative_bit_set():
    """A float row whose negation is lazy (the imaginary part of a conjugated complex tensor)
    has no numpy view; greedy_token gives torch's argmax for it instead of raising."""
    from tsspec.runtime.sampling import greedy_token

    z = torch.complex(torch.zeros(5), torch.tensor([3.0, -2.0, 1.0, -7.0, 0.5]))
    row = z.conj().imag  # [5] float32: 3, -2, 1, -7, 0.5 negated lazily
    assert row.is_neg() and row.dtype == torch.float32
    assert greedy_token(row) == int(torch.argmax(row).item()) == 3


def test_presence_and_frequency_penalties_llama_cpp_semantics():
    s = Sampler(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repeat_last_n=4))
    logits = torch.tensor([1.0, 1.0, 1.0, 1.0])
    # window [1, 1, 2, 1] (the first 0 is outside the last 4): token 1 three times, 2 once
    out = s.adjust(logits, [0, 1, 1, 2, 1])
    assert out.tolist() == [1.0, 1.0 - 3 * 0.25 - 0.5, 1.0 - 0.25 - 0.5, 1.0]
    assert logits.tolist() == [1.0] * 4  # the input is not changed
    assert s.lookback == 4
    # a negative presence penalty favours what was said
    assert Sampler(SamplingParams(presence_penalty=-2.0)).sample(torch.tensor([1.0, 0.5]), 0, [1]) == 1


def test_repetition_then_presence_penalty_stack():
    s = Sampler(SamplingParams(repeat_penalty=2.0, presence_penalty=1.0))
    assert s.adjust(torch.tensor([4.0, -2.0]), [0, 1]).tolist() == [1.0, -5.0]


def test_logit_bias_reads_no_token_but_reports_a_lookback():
    s = Sampler(SamplingParams(logit_bias=((0, -100.0), (2, 5.0), (99, 1.0))))  # 99: outside, ignored
    logits = torch.tensor([3.0, 2.0, 0.0])
    assert s.adjust(logits, []).tolist() == [-97.0, 2.0, 5.0]
    assert s.sample(logits, 0, []) == 2
    assert s.lookback == 1  # DraftContext: a bias that reads no token still reports one


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
def test_penalties_out_of_range(name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: 2.5})


def test_logprobs_recorded_from_the_adjusted_logits():
    s = Sampler(SamplingParams(logit_bias=((1, 1.0),)), logprobs=2)
    logits = torch.tensor([0.0, 0.0, -1.0])
    token = s.sample(logits, 7, [])
    entry = s.recorded[7]
    expected = torch.log_softmax(torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64), dim=-1)
    assert token == 1 and entry.token == 1 and entry.logprob == pytest.approx(float(expected[1]))
    assert [i for i, _ in entry.top] == [1, 0] and entry.top[1][1] == pytest.approx(float(expected[0]))
    assert Sampler(SamplingParams()).sample(logits, 7, []) == 0 and not Sampler().recorded  # off: nothing kept
