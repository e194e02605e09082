"""tsspec-kernels-cuda: CUDA kernels for the model plugins' hot paths, registered through the
core's ``tsspec_register_kernels`` hook.

Ops (``sources.KERNELS``; signatures and semantics in ``reference``): ``gdn_verify``,
``gdn_step``, ``gdn_commit`` (Gated DeltaNet with per-row state slots), ``dflash_inject``,
``dflash_block_attention``, ``dflash_grouped_conv`` (DFlash / DFlash2) and ``selector_lattice``
(DFlash2's candidate lattice). Each is registered for ``device="cuda"``; where CuPy or a device
is missing, registered as unavailable with the reason, so ``tsspec plugins`` says why and the
model plugins keep their torch paths. Importing this package imports neither CuPy nor CUDA.
"""

from __future__ import annotations

from tsspec.hookspecs import hookimpl

__all__ = ["tsspec_register_kernels", "OP_DESCRIPTIONS"]

OP_DESCRIPTIONS = {
    "gdn_verify": "GDN recurrence over k+1 verify rows, a state slot per row (conv window included)",
    "gdn_step": "one committing GDN row from the live state or a pending slot (the deferred commit)",
    "gdn_commit": "slot m of the last verify into the live state, every GDN layer in one launch",
    "dflash_inject": "DFlash pass B: fc, RMSNorm, K/V, head norm, RoPE, ring write, one launch",
    "dflash_block_attention": "DFlash pass C attention over ring window + block (online softmax)",
    "dflash_grouped_conv": "DFlash2 grouped dynamic conv along the block, residual fused",
    "selector_lattice": "DFlash2 top-k candidates and pair scores, compact readback",
}


def _lazy(op: str):
    """The op's CUDA wrapper, imported at first call (keeps CuPy out of start-up)."""

    def call(*args, **kwargs):
        from . import ops

        return getattr(ops, op)(*args, **kwargs)

    call.__name__ = call.__qualname__ = op
    call.__doc__ = f"CUDA kernel {op} (tsspec_kernels_cuda.ops.{op})"
    return call


@hookimpl
def tsspec_register_kernels(register):
    from .loader import probe

    found = probe()
    for op, text in OP_DESCRIPTIONS.items():
        register(op, _lazy(op), device="cuda", description=text, available=found.available,
                 reason=found.describe())
