"""The adapters' base, told apart (trainer_contract.adapter_mismatch): `serve --adapter` refuses adapters trained on
another model by what their adapter_config.json records; mlx-lm's own adapters record nothing and pass."""
from clusterctl.trainer_contract import adapter_mismatch

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 323,
         "quantization": {"bits": 4, "group_size": 32}}
TRAINED = {"fine_tune_type": "lora", "num_layers": 2, "base": {"model_type": "llama", "hidden_size": 64,
                                                             "num_hidden_layers": 2, "vocab_size": 323}}


def test_the_same_model_quantized_or_not_fits_and_another_does_not():
    assert adapter_mismatch(TRAINED, LLAMA) is None
    assert adapter_mismatch(TRAINED, {k: v for k, v in LLAMA.items() if k != "quantization"}) is None
    assert adapter_mismatch(TRAINED, {**LLAMA, "model_type": "qwen3"}) == "model_type llama there, qwen3 here"
    assert adapter_mismatch(TRAINED, {**LLAMA, "hidden_size": 128, "num_hidden_layers": 4}) == \
        "hidden_size 64 there, 128 here; num_hidden_layers 2 there, 4 here"
    # a multimodal config keeps the text model's shape under text_config
    assert adapter_mismatch(TRAINED, {"model_type": "llama", "text_config": {k: v for k, v in LLAMA.items()
                                                                             if k != "model_type"}}) is None


def test_adapters_that_say_nothing_of_their_base_are_not_refused():
    assert adapter_mismatch({"fine_tune_type": "lora", "num_layers": 16}, LLAMA) is None
