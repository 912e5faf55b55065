"""Repository tools (not installed): generated documentation and shown outputs."""
