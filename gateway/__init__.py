"""tiergate: a precision-tier routing gateway for LLM serving.

Import nothing heavy here: the CLI, the simulator and the router tooling import only the
sub-modules they need.
"""

__version__ = "0.1.0"
