"""tsspec bench: paired, alternating measurements against plain decoding and peers."""
