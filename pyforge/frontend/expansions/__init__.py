"""Expansion rules, one module per family; ``pyforge.frontend.expand`` imports every module here."""
