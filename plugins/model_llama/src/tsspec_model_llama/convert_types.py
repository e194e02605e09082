"""The checkpoint types ``convert.convert_hf_dir`` takes (a cheap import for the plugin's hook)."""

# config.json model_type -> the GGUF architecture it converts to
MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
               "gemma2": "gemma2", "gemma3_text": "gemma3"}
