"""Shadow evaluation: replay a share of cheaper-tier requests on the top tier, off the
critical path, and turn agreement into adequacy labels for calibrating the router on a
team's own traffic (every tier is the same checkpoint, so the top tier is a free reference).
"""
