"""The shared runtime: the loop, trunks, governor, registry, sampling, options and stats."""
