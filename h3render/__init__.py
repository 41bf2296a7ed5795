"""h3render: queue video renders with local diffusion models and find them in the morning."""

__version__ = "0.1.0"
