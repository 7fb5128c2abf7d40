"""digiq: reproducible Digi-Q (value-based offline RL for Android agents)."""

__version__ = "0.1.0"
