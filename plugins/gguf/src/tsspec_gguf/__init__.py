"""The modeling toolkit for model plugins: a PUBLIC API (see docs/architecture.md).

Model plugins may import these submodules and the names in each one's ``__all__`` (or its
documented classes and functions); they change only with a major version of tsspec, with a
changelog entry in docs/plugins.md. This package re-exports nothing, so importing it stays cheap.

* ``gguf_file`` -- ``GGUFFile``: a memory-mapped GGUF with typed metadata and tensors; every
  failure is a one-line ``ModelLoadError`` (``gguf_header`` is its bounded parser);
  ``MemorySource``: the same reading methods over dicts (a converter's output without a file).
* ``gguf_writer`` -- ``write_gguf``: converters and tests write GGUF files with it.
* ``dequant`` -- vectorised torch dequantisation of the ggml types.
* ``qlinear`` -- ``BlockMatrix``: matmuls on a file's quantised blocks, row-invariant on the CPU.
* ``attention`` / ``rowops`` / ``native`` -- row-invariant CPU kernels and whether they are built.
* ``cache`` -- ``WeightCache``: prepared weights kept on disk so a second load takes seconds;
  ``join_block_matrices`` joins the flat block tensors of a cache entry into ``BlockMatrix``es.
* ``row_timing`` -- ``time_rows``: a forward's cost by rows, each width timed over the one-row
  forward of its own round (medians, monotone); a target's ``spec_verify_row_ms`` measured so.
* ``tokenizer`` / ``chat_template`` -- the tokenizer and chat template a GGUF describes.
* ``embedded`` -- where the embedded default model (SmolLM2-135M-Instruct) is installed.
* ``random_llama`` -- ``write_random_llama``: a small random llama GGUF for tests.
* ``build`` -- ``api_extensions()``: a plugin's extension on the kernels' C-API (its setup.py loads it by path).

It registers itself as the core's file toolkit (architecture sniffing, target identity,
what the compiled kernels run), so the core reads model files without naming this package.
"""

__all__ = [
    "attention",
    "build",
    "cache",
    "chat_template",
    "dequant",
    "embedded",
    "gguf_file",
    "gguf_writer",
    "native",
    "qlinear",
    "random_llama",
    "row_timing",
    "rowops",
    "tokenizer",
]

from tsspec import hookimpl


@hookimpl
def tsspec_register_commands(app):
    """``tsspec inspect FILE``: a GGUF's metadata, tensors and weight formats."""
    from .inspect_cmd import inspect

    app.command("inspect")(inspect)


@hookimpl
def tsspec_register_file_toolkit(register):
    """The core reads model files through these (it names no file format itself)."""
    from .gguf_file import read_architecture
    from .identity import TargetIdentity

    def kernels_info() -> dict:
        from . import native

        return native.info()

    register(read_architecture, TargetIdentity, kernels_info=kernels_info)
