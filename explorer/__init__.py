"""explorer: which (layers, heads) split gives the best accuracy for a parameter budget."""

__version__ = "0.1.0"
