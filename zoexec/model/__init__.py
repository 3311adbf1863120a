"""Hugging Face model families taken apart into blocks, random init, 16-bit precision
rules, and the export back to an HF folder."""
