"""Development tools: the API reference's Griffe extension (docs_roles.py), the package map (structure.py)."""
