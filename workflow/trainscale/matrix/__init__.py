"""The old way in, kept for scripts: `python -m trainscale.matrix CONFIG...` is
`trainscale check CONFIG...`. The matrix itself is trainscale.plan.matrix."""
