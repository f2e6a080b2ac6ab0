"""rhymectl's library: GRPO with rollouts accelerated by history and sibling drafts.

Importable without the CLI; each subpackage is one box of the design (see README).
"""

__version__ = "0.1.0"
