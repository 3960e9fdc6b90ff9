"""Network definitions for the models with real weights shipped in the project."""
