"""Training learned drafters by self-distillation from a loaded target (``tsspec train-drafter``).

One shared core for every drafter kind; the plugin that owns a kind registers its trainer
through ``tsspec_register_trainers`` and builds on these modules:

* ``prompts``  the instruction prompts whose answers the target writes (with a held-out split);
* ``corpus``   text that ships on this machine (the standard library, installed packages'
  documentation) plus the target's own chat answers, with a manifest (source, tokens, license);
* ``answers``  the target's greedy answers to many prompts at once (its batched paged path);
* ``teacher``  the target in teacher-forcing mode: one multi-row ``spec_forward`` per chunk gives
  every position's hidden rows (or tapped residuals) and the target's own argmax labels;
* ``vocab``    the FR-Spec draft vocabulary (the K most frequent target predictions);
* ``loop``     a seeded, resumable torch training loop with a progress bar;
* ``request``  what a trainer receives (``TrainRequest``) and the kind registry.

Importing this package loads no torch; the modules do when imported.
"""

from tsspec import hookimpl


@hookimpl
def tsspec_register_commands(app):
    """``tsspec train-drafter``."""
    from .command import train_drafter

    app.command("train-drafter")(train_drafter)
