"""The ``tsspec`` command line: one module per command group."""
