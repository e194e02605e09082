"""Model plumbing shared by the model plugins (import the submodules; this package re-exports
nothing so that importing it stays cheap):

* ``gguf_file`` -- ``GGUFFile``: a memory-mapped GGUF with typed metadata and tensors; every
  failure is a one-line ``ModelLoadError`` (``gguf_header`` is its bounded parser).
* ``dequant`` -- vectorised torch dequantisation of the ggml types.
* ``cache`` -- ``WeightCache``: prepared weights kept on disk so a second load takes seconds.
* ``tokenizer`` / ``chat_template`` -- the tokenizer and chat template a GGUF describes.
* ``gguf_writer_util`` -- ``write_gguf`` for tests (tiny models converted from transformers).
* ``embedded`` -- where the embedded default model (SmolLM2-135M-Instruct) is installed.
"""
