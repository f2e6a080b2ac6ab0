"""rhymectl's command line: one module per command; the library lives in `pipeline`."""

# The one place the version is written: pyproject.toml reads it (`dynamic = ["version"]`),
# and `rhymectl --version` prints it, so a source checkout reports what it is even when the
# installed (editable) metadata predates the last bump. CONTRIBUTING.md: cutting a release.
__version__ = "0.1.0"
