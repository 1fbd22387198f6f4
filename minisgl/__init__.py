"""minisgl: a compact LLM serving engine, rebuilt chapter by chapter in the workbook."""

__version__ = "0.1.0"
