"""``tsspec``'s public surface: ``__all__`` is the user API and the plugin contract, no more."""

import tsspec

USER_API = {"load_model", "generate", "Generation", "SpeculationOptions", "SamplingParams", "TsspecError"}
CONTRACT = {
    "__version__", "CONTRACT_VERSION", "hookimpl", "SpeculativeTarget", "BatchedSpeculativeTarget", "PagedKV",
    "PagedRows", "ModelConfig", "Tokenizer", "DraftHead", "DraftHeadKind", "Speculator", "SpeculatorDeclined",
    "DraftContext", "Proposal", "SpeculatorInfo", "TargetInfo", "DrafterInfo", "require_feature_width",
}


def test_all_is_its_list():
    assert len(tsspec.__all__) == len(set(tsspec.__all__)) <= 25
    assert set(tsspec.__all__) == USER_API | CONTRACT
    for name in tsspec.__all__:
        assert getattr(tsspec, name) is not None


def test_internals_stay_importable_but_unexported():
    for name in ("SpeculativeExecution", "SpeculatorRegistry", "Sampler", "LoadOptions", "PluginHost", "SpecTrunk"):
        assert getattr(tsspec, name) is not None and name not in tsspec.__all__
