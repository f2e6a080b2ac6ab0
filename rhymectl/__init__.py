"""rhymectl's command line: one module per command; the library lives in `pipeline`."""
